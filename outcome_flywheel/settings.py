"""Environment variables the project reads, with their embedded defaults and their rules.

Dagster resources take their fields from here through `resources.settings.env_or_default`, so a
variable that is set shows in the Dagster UI as an `EnvVar` and one that is not falls back to the
default.
`validate_environment` checks every set variable against `RULES` when the definitions load.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Callable, Mapping
from urllib.parse import urlsplit

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DATA = PROJECT_ROOT / "sample_data"

# name -> default, the one place each default lives; docs/settings.md lists the same (and what each means).
DEFAULTS: dict[str, str] = {
    "FLYWHEEL_DATA_DIR": "./data",
    "FLYWHEEL_BASE_MODEL": "tiny-local",
    "FLYWHEEL_BACKEND": "torch",
    "FLYWHEEL_SAMPLER": "torch",
    "FLYWHEEL_DEVICE": "auto",
    "FLYWHEEL_DTYPE": "auto",
    "FLYWHEEL_SEED": "0",
    "FLYWHEEL_TIMEZONE": "America/New_York",
    "FLYWHEEL_MAX_HEADLINES": "30",
    "FLYWHEEL_MIN_HEADLINES": "1",
    "FLYWHEEL_OUTCOME_HORIZON": "1",
    "FLYWHEEL_OUTCOME_COST_BPS": "10",
    "FLYWHEEL_PRICE_MAX_STALENESS": "4",
    "FLYWHEEL_API_HOST": "127.0.0.1",
    "FLYWHEEL_API_PORT": "8765",
    "FLYWHEEL_STEP_RUNNER": "subprocess",
    "FLYWHEEL_STEP_LAUNCHER": "python",
    "FLYWHEEL_STEP_PROCESSES": "1",
    "FLYWHEEL_K8S_GPUS": "1",
    "FLYWHEEL_K8S_DATA_MOUNT": "/data",
    "FLYWHEEL_SERVE_MAX_TOKENS": "512",
    "FLYWHEEL_TEACHER_MODEL": "tiny-local-teacher",
    "FLYWHEEL_DISTILL_MIN_SAMPLES": "100",
    "FLYWHEEL_TRAINER_LOCK_WAIT_S": "3600",
    "FLYWHEEL_TRAINER_LOCK_LEASE_S": "60",
    "FLYWHEEL_PROD_HOME": ".dagster-prod",
    "FLYWHEEL_WEBSERVER_PORT": "3030",
    "FLYWHEEL_MLFLOW_PORT": "5050",
    "FLYWHEEL_DAILY_SCHEDULE": "auto",
    "FLYWHEEL_TRAIN_RECOMPUTE": "auto",
    "FLYWHEEL_ROLLOUTS_PER_HEADLINE": "8",
    "FLYWHEEL_NOTE_FORMAT": "sections",
}


# FLYWHEEL_NOTE_FORMAT's choices (models/prompts.py writes each; here so the rule and the prompt share them).
NOTE_FORMATS: tuple[str, ...] = ("sections", "call_first")


def env(name: str, default: str | None = None) -> str:
    """The variable's value, else `default`, else the project default."""
    value = os.environ.get(name)
    if value not in (None, ""):
        return value
    if default is not None:
        return default
    return DEFAULTS[name]


def resolve_path(path: str | os.PathLike) -> Path:
    """Relative paths are taken from the project root, so the demo, tests and the UI agree."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else (PROJECT_ROOT / p)


# -- validation ------------------------------------------------------------------------------
# EnvVar fields are resolved only when a run starts, so a bad value would otherwise load fine and
# fail (or worse, silently misbehave) in the middle of a run; these rules read os.environ at load.


class SettingsError(ValueError):
    """Environment variables whose values the project cannot use."""


@dataclass(frozen=True)
class Rule:
    """What a variable may hold: `allowed` says it in words; `problem(value)` is None when fine."""

    allowed: str
    problem: Callable[[str], str | None]


def one_of(*values: str) -> Rule:
    return Rule("one of " + ", ".join(values), lambda v: None if v in values else "not an allowed value")


def integer(low: int, high: int | None = None) -> Rule:
    allowed = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"

    def problem(value: str) -> str | None:
        try:
            number = int(value)
        except ValueError:
            return "not an integer"
        return None if low <= number and (high is None or number <= high) else "out of range"

    return Rule(allowed, problem)


def _date(value: str) -> str | None:
    # date.fromisoformat also takes 20250101 and week dates; Dagster's partitions want YYYY-MM-DD.
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return "not a YYYY-MM-DD date"
    try:
        date.fromisoformat(value)
    except ValueError:
        return "not a real date"
    return None


@lru_cache(maxsize=1)
def _zones() -> frozenset[str]:
    import zoneinfo

    return frozenset(zoneinfo.available_timezones()) - {"localtime"}  # a machine alias, not an IANA name


def _timezone(value: str) -> str | None:
    return None if value in _zones() else "unknown time zone"


def feed_url_problem(url: str) -> str | None:
    """Why `url` cannot be a live feed URL, or None. Only http(s) with a host: urllib would also open
    file:// and ftp:// URLs, but local feed files are the archive's job, and a URL setting should
    not read the machine's files."""
    try:
        parts = urlsplit(url)
    except ValueError as err:  # e.g. an unclosed [IPv6 bracket
        return f"{url!r} is not a URL ({err})"
    if parts.scheme.lower() not in ("http", "https"):
        return f"{url!r} is not an http(s) URL (scheme {parts.scheme or 'none'!r})"
    if not parts.hostname:
        return f"{url!r} has no host"
    return None


_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def warehouse_url_problem(url: str) -> str | None:
    """Why `url` cannot be FLYWHEEL_WAREHOUSE_URL, or None: empty (the data dir's warehouse/), a
    folder path, or s3://bucket/prefix (S3 bucket naming: 3-63 lower-case letters, digits, dots, dashes)."""
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", url)
    if not scheme:
        return None  # a folder
    if scheme.group(1).lower() != "s3":
        return f"scheme {scheme.group(1)!r} is not supported (only s3://, or a folder path)"
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not _BUCKET.fullmatch(bucket):
        return f"{bucket!r} is not an S3 bucket name"
    if any(c in prefix for c in "?#*[]") or "//" in prefix.strip("/"):
        return f"prefix {prefix!r} has an empty folder or one of ? # * [ ]"
    return None


def s3_endpoint_problem(endpoint: str) -> str | None:
    """Why `endpoint` cannot be FLYWHEEL_S3_ENDPOINT, or None: http(s)://host[:port], nothing after."""
    if endpoint == "":
        return None
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as err:
        return f"{endpoint!r} is not a URL ({err})"
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return f"{endpoint!r} is not an http(s)://host[:port] URL"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return f"{endpoint!r} has more than a scheme, host and port"
    return None


def tracking_uri_problem(uri: str) -> str | None:
    """Why `uri` cannot be FLYWHEEL_MLFLOW_TRACKING_URI, or None: `off`, an http(s)://host[:port] MLflow
    server, or a database URI MLflow's store takes (sqlite:///path, postgresql://..., mysql://...)."""
    if uri.strip().lower() == "off":
        return None
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", uri)
    if not scheme:
        return f"{uri!r} is not a URI (scheme://...) nor off"
    name = scheme.group(1).lower()
    if name in ("http", "https"):
        return None if urlsplit(uri).hostname else f"{uri!r} has no host"
    if name.split("+")[0] in ("sqlite", "postgresql", "mysql", "mssql"):
        return None
    return f"scheme {name!r} is not an MLflow tracking store here (http(s), sqlite, postgresql, mysql, mssql)"


def _non_negative_number(value: str) -> str | None:
    try:
        number = float(value)
    except ValueError:
        return "not a number"
    return None if number >= 0 and number == number and number != float("inf") else "out of range"


def _lease(value: str) -> str | None:
    problem = _non_negative_number(value)
    return problem or (None if float(value) >= 0.1 else "out of range")


def _gib(value: str) -> str | None:
    problem = _non_negative_number(value)
    return problem or (None if float(value) > 0 else "out of range")


def _feed_urls(value: str) -> str | None:
    problems = [p for p in (feed_url_problem(u.strip()) for u in value.split(",") if u.strip()) if p]
    return "; ".join(problems) or None


# name -> rule, for every variable with a closed set of values or a type (the README's table).
RULES: dict[str, Rule] = {
    "FLYWHEEL_BACKEND": one_of("torch", "mlx"),
    "FLYWHEEL_SAMPLER": one_of("torch", "vllm"),
    "FLYWHEEL_DEVICE": Rule(
        "auto, cpu, cuda, cuda:N (N = 0, 1, ...) or mps",
        lambda v: None if re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v) else "unknown device",
    ),
    "FLYWHEEL_DTYPE": one_of("auto", "float32", "bfloat16", "float16"),
    "FLYWHEEL_SEED": integer(0, 2**32 - 1),  # numpy's seeds stop at 2**32 - 1
    "FLYWHEEL_START_DATE": Rule("a date YYYY-MM-DD, e.g. 2025-01-01", _date),
    "FLYWHEEL_DAILY_RL_START_DATE": Rule("a date YYYY-MM-DD, e.g. 2025-11-03", _date),
    "FLYWHEEL_PREFERENCES_START_DATE": Rule("a date YYYY-MM-DD, e.g. 2025-06-03", _date),
    "FLYWHEEL_TIMEZONE": Rule("an IANA time zone name, e.g. America/New_York, Europe/London or UTC", _timezone),
    "FLYWHEEL_FEED_URLS": Rule(
        "comma-separated http:// or https:// URLs (local feed files go in FLYWHEEL_FEEDS_ARCHIVE/YYYY-MM-DD/)",
        _feed_urls,
    ),
    "FLYWHEEL_MAX_HEADLINES": integer(1),
    "FLYWHEEL_MIN_HEADLINES": integer(0),  # 0 turns the minimum_headlines check off
    "FLYWHEEL_ROLLOUTS_PER_HEADLINE": integer(2, 8),  # a group needs 2 to normalise; the judge's letters are A-H
    "FLYWHEEL_MAX_NEW_TOKENS": integer(1),
    "FLYWHEEL_NOTE_FORMAT": one_of(*NOTE_FORMATS),
    "FLYWHEEL_MARKET_DATA": one_of("file", "yfinance"),
    "FLYWHEEL_OUTCOME_HORIZON": integer(1, 60),
    "FLYWHEEL_OUTCOME_COST_BPS": Rule("a number >= 0 (basis points, round trip), e.g. 10", _non_negative_number),
    "FLYWHEEL_PRICE_MAX_STALENESS": integer(0, 60),  # policy updates; the window is the longest price wait
    "FLYWHEEL_MIN_NEW_PAIRS": integer(1),
    "FLYWHEEL_TRAIN_COOLDOWN_S": integer(0),
    "FLYWHEEL_API_HOST": Rule(
        "an IP address or host name to bind the service to, e.g. 127.0.0.1 (loopback, the default) or 0.0.0.0 (every interface)",
        lambda v: None if re.fullmatch(r"[A-Za-z0-9.:-]+", v) else "not an address or host name",
    ),
    "FLYWHEEL_API_PORT": integer(1, 65535),
    "FLYWHEEL_API_TOKEN": Rule(
        "at least 16 characters without spaces (the service's bearer token; unset = one made at start and printed)",
        lambda v: None if len(v) >= 16 and not any(c.isspace() for c in v) else "too short or has spaces",
    ),
    "FLYWHEEL_WAREHOUSE_URL": Rule(
        "empty (<FLYWHEEL_DATA_DIR>/warehouse), a folder path, or s3://bucket/prefix, e.g. s3://flywheel/warehouse",
        warehouse_url_problem,
    ),
    "FLYWHEEL_S3_ENDPOINT": Rule(
        "empty (AWS) or the http(s)://host[:port] of an S3-compatible server, e.g. http://127.0.0.1:8333",
        s3_endpoint_problem,
    ),
    # MLflow: every training's run and the registered models (outcome_flywheel/tracking/); empty = the data dir's SQLite
    "FLYWHEEL_MLFLOW_TRACKING_URI": Rule(
        "empty (sqlite:///<FLYWHEEL_DATA_DIR>/mlflow/mlflow.db), off, an MLflow server http(s)://host:port, "
        "or a database URI such as sqlite:///path/mlflow.db or postgresql://...",
        tracking_uri_problem,
    ),
    # where the training steps run (resources/steps.py, docs/pipes.md)
    "FLYWHEEL_STEP_RUNNER": one_of("subprocess", "in_process", "k8s"),
    "FLYWHEEL_STEP_LAUNCHER": one_of("python", "accelerate", "torchrun"),
    "FLYWHEEL_STEP_PROCESSES": integer(1),
    "FLYWHEEL_K8S_GPUS": integer(0),
    # the service's runs through a webserver (GraphQL) and its OpenAI-compatible serving (service/config.py)
    "FLYWHEEL_DAGSTER_URL": Rule(
        "empty (the service's own worker) or the http(s)://host:port of a Dagster webserver, e.g. http://127.0.0.1:3030",
        lambda v: None if re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", v) else "not an http(s) URL",
    ),
    "FLYWHEEL_SERVE_MAX_TOKENS": integer(1),
    # the slower tiers (docs/tiers.md)
    "FLYWHEEL_DISTILL_MIN_SAMPLES": integer(1),
    "FLYWHEEL_TRAINER_LOCK_WAIT_S": integer(0),
    "FLYWHEEL_TRAINER_LOCK_LEASE_S": Rule("a number of seconds >= 0.1, e.g. 60", _lease),
    # training within a memory budget (models/train/memory.py); empty = what the accelerator has free
    "FLYWHEEL_TRAIN_MEMORY_GIB": Rule("empty (the accelerator's free memory) or a number of GiB > 0, e.g. 16", _gib),
    # the layers' activations recomputed in the backward pass where that takes fewer micro-batches (memory.py)
    "FLYWHEEL_TRAIN_RECOMPUTE": one_of("auto", "always", "never"),
    # `make up` (deploy/, docs/deploy.md); FLYWHEEL_PG_PORT / FLYWHEEL_CODE_SERVER_PORT unset = a free port
    "FLYWHEEL_PG_PORT": integer(1, 65535),
    "FLYWHEEL_CODE_SERVER_PORT": integer(1, 65535),
    "FLYWHEEL_WEBSERVER_PORT": integer(1, 65535),
    "FLYWHEEL_MLFLOW_PORT": integer(1, 65535),
    "FLYWHEEL_DAILY_SCHEDULE": one_of("auto", "on", "off"),
    "FLYWHEEL_PREFERENCE_CONTEXT": Rule(
        "comma-separated decision-context keys (letters, digits, _), `note` for the proposal's note, `*` for all, e.g. regime,note",
        lambda v: (
            None
            if all(re.fullmatch(r"\*|[A-Za-z0-9_]+", k.strip()) for k in v.split(","))
            else "not a list of key names"
        ),
    ),
}
# Paths and model names: no closed set; they are checked where they are used (with their name).
FREE_FORM = (
    "FLYWHEEL_DATA_DIR",
    "FLYWHEEL_BASE_MODEL",
    "FLYWHEEL_FEEDS_ARCHIVE",
    "FLYWHEEL_JUDGE_MODEL",
    "FLYWHEEL_AUDIT_LOG",
    "FLYWHEEL_PRICES_FILE",
    "FLYWHEEL_FEEDBACK_LOG",
    "FLYWHEEL_LIVE_AUDIT_LOG",
    # the step pod's image, namespace, sizes, volume and Secret: Kubernetes checks them when the pod is made
    "FLYWHEEL_K8S_IMAGE",
    "FLYWHEEL_K8S_NAMESPACE",
    "FLYWHEEL_K8S_CPU",
    "FLYWHEEL_K8S_MEMORY",
    "FLYWHEEL_K8S_DATA_PVC",
    "FLYWHEEL_K8S_DATA_MOUNT",
    "FLYWHEEL_K8S_ENV_SECRET",
    # the distillation teacher (a hub id or folder; never the policy), llama.cpp for GGUF exports, make up's folders
    "FLYWHEEL_TEACHER_MODEL",
    "FLYWHEEL_LLAMA_CPP_DIR",
    "FLYWHEEL_PROD_HOME",
    "FLYWHEEL_PG_DIR",
)
# Secrets: checked by their rule, never printed (`flywheel check-settings` masks them).
SECRETS = ("FLYWHEEL_API_TOKEN",)


def settings_problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per variable of `environ` (default: os.environ) that breaks its rule; empty = unset."""
    environ = os.environ if environ is None else environ
    problems = []
    for name, rule in RULES.items():
        value = environ.get(name)
        if value in (None, ""):
            continue
        problem = rule.problem(value)
        if problem:
            shown = "<hidden>" if name in SECRETS else repr(value)
            problems.append(f"{name}={shown}: {problem}; allowed: {rule.allowed}")
    if not problems:  # each value is fine on its own: now the ones that must agree
        low = int(environ.get("FLYWHEEL_MIN_HEADLINES") or DEFAULTS["FLYWHEEL_MIN_HEADLINES"])
        high = int(environ.get("FLYWHEEL_MAX_HEADLINES") or DEFAULTS["FLYWHEEL_MAX_HEADLINES"])
        if low > high:
            problems.append(
                f"FLYWHEEL_MIN_HEADLINES={str(low)!r}: more than FLYWHEEL_MAX_HEADLINES={high}, so every day would fail "
                f"the minimum_headlines check; allowed: an integer from 0 to FLYWHEEL_MAX_HEADLINES"
            )
    return problems


def validate_environment(environ: Mapping[str, str] | None = None) -> None:
    """Raise `SettingsError` naming every bad FLYWHEEL_* variable, its value and the allowed values."""
    problems = settings_problems(environ)
    if problems:
        count = f"{len(problems)} setting{'s' if len(problems) > 1 else ''}"
        raise SettingsError(
            f"Invalid settings: {count} cannot be used (fix the variable, or unset it for the default):\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
