"""Settings are checked when the definitions load: a bad FLYWHEEL_* value is rejected, named, with
the values it may take."""

import os
import re
import subprocess

import pytest

from outcome_flywheel.settings import (
    DEFAULTS,
    FREE_FORM,
    PROJECT_ROOT,
    RULES,
    SettingsError,
    settings_problems,
    validate_environment,
)

# (variable, bad value, words the message must contain besides the variable: the allowed values)
BAD = [
    ("FLYWHEEL_BACKEND", "foo", ["torch", "mlx"]),
    ("FLYWHEEL_BACKEND", "Torch", ["torch", "mlx"]),
    ("FLYWHEEL_DEVICE", "gpu", ["auto", "cpu", "cuda", "cuda:N", "mps"]),
    ("FLYWHEEL_DEVICE", "cuda:x", ["cuda:N"]),
    ("FLYWHEEL_DTYPE", "bf16", ["auto", "float32", "bfloat16", "float16"]),
    ("FLYWHEEL_MARKET_DATA", "yahoo", ["file", "yfinance"]),
    ("FLYWHEEL_SEED", "abc", ["integer", "0", "4294967295"]),
    ("FLYWHEEL_SEED", "1.5", ["integer"]),
    ("FLYWHEEL_SEED", "-1", ["integer", "0", "4294967295"]),
    ("FLYWHEEL_START_DATE", "2025-13-01", ["YYYY-MM-DD"]),
    ("FLYWHEEL_START_DATE", "01/02/2025", ["YYYY-MM-DD"]),
    ("FLYWHEEL_START_DATE", "20250101", ["YYYY-MM-DD"]),
    ("FLYWHEEL_TIMEZONE", "Mars/Olympus_Mons", ["IANA", "America/New_York"]),
    ("FLYWHEEL_TIMEZONE", "EST+5", ["IANA"]),
    ("FLYWHEEL_FEED_URLS", "file:///tmp/feed.xml", ["http://", "https://", "FLYWHEEL_FEEDS_ARCHIVE"]),
    (
        "FLYWHEEL_FEED_URLS",
        "https://example.com/rss, ftp://example.com/x",
        ["http://", "https://", "ftp://example.com/x"],
    ),
    ("FLYWHEEL_FEED_URLS", "http:///no-host", ["http://", "https://"]),
    ("FLYWHEEL_MAX_HEADLINES", "0", ["integer", ">= 1"]),
    ("FLYWHEEL_MIN_HEADLINES", "-1", ["integer", ">= 0"]),
    ("FLYWHEEL_MIN_HEADLINES", "some", ["integer"]),
    ("FLYWHEEL_ROLLOUTS_PER_HEADLINE", "9", ["integer", "2", "8"]),
    ("FLYWHEEL_ROLLOUTS_PER_HEADLINE", "1", ["integer", "2", "8"]),
    ("FLYWHEEL_MAX_NEW_TOKENS", "0", ["integer", ">= 1"]),
    ("FLYWHEEL_NOTE_FORMAT", "prose", ["sections", "call_first"]),
    ("FLYWHEEL_MIN_NEW_PAIRS", "ten", ["integer", ">= 1"]),
    ("FLYWHEEL_TRAIN_COOLDOWN_S", "-5", ["integer", ">= 0"]),
]


@pytest.mark.parametrize("name, value, allowed", BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_a_bad_value_is_rejected_with_its_name_and_the_allowed_values(name, value, allowed):
    problems = settings_problems({name: value})
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{name}={value!r}")
    for word in allowed:
        assert word in problems[0], (word, problems[0])
    with pytest.raises(SettingsError, match=re.escape(name)):
        validate_environment({name: value})


GOOD = {
    "FLYWHEEL_BACKEND": ["torch", "mlx"],
    "FLYWHEEL_DEVICE": ["auto", "cpu", "cuda", "cuda:0", "cuda:1", "mps"],
    "FLYWHEEL_DTYPE": ["auto", "float32", "bfloat16", "float16"],
    "FLYWHEEL_MARKET_DATA": ["file", "yfinance"],
    "FLYWHEEL_SEED": ["0", "42", "4294967295"],
    "FLYWHEEL_START_DATE": ["2025-01-01", "2024-02-29"],
    "FLYWHEEL_TIMEZONE": ["America/New_York", "UTC", "Europe/London", "Asia/Tokyo"],
    "FLYWHEEL_FEED_URLS": ["https://example.com/rss.xml", "http://127.0.0.1:8000/a.xml, https://example.org/feed?x=1,"],
    "FLYWHEEL_MAX_HEADLINES": ["1", "30", "500"],
    "FLYWHEEL_MIN_HEADLINES": ["0", "1"],
    "FLYWHEEL_ROLLOUTS_PER_HEADLINE": ["2", "8"],
    "FLYWHEEL_MAX_NEW_TOKENS": ["1", "512"],
    "FLYWHEEL_NOTE_FORMAT": ["sections", "call_first"],
    "FLYWHEEL_MIN_NEW_PAIRS": ["1", "10"],
    "FLYWHEEL_TRAIN_COOLDOWN_S": ["0", "3600"],
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_values_pass(name):
    for value in GOOD[name]:
        assert settings_problems({name: value}) == [], (name, value)


def test_defaults_and_unset_and_empty_pass():
    assert settings_problems({}) == []
    assert settings_problems(dict(DEFAULTS)) == []
    assert settings_problems({name: "" for name in RULES}) == []  # empty = unset = the default
    validate_environment({})


def test_every_problem_is_reported_at_once():
    with pytest.raises(SettingsError) as err:
        validate_environment(
            {"FLYWHEEL_BACKEND": "foo", "FLYWHEEL_SEED": "x", "FLYWHEEL_TIMEZONE": "Nowhere", "FLYWHEEL_DEVICE": "cpu"}
        )
    message = str(err.value)
    assert "3 " in message
    for name in ("FLYWHEEL_BACKEND", "FLYWHEEL_SEED", "FLYWHEEL_TIMEZONE"):
        assert name in message
    assert "FLYWHEEL_DEVICE" not in message


def test_the_minimum_may_not_exceed_the_cap():
    problems = settings_problems({"FLYWHEEL_MIN_HEADLINES": "40"})  # cap: the default 30
    assert len(problems) == 1 and "FLYWHEEL_MIN_HEADLINES" in problems[0] and "FLYWHEEL_MAX_HEADLINES" in problems[0]
    assert settings_problems({"FLYWHEEL_MIN_HEADLINES": "40", "FLYWHEEL_MAX_HEADLINES": "40"}) == []


def test_every_variable_of_the_settings_table_has_a_rule_or_is_free_form():
    table = (PROJECT_ROOT / "docs" / "settings.md").read_text()
    documented = set(re.findall(r"^\| `(FLYWHEEL_[A-Z0-9_]+)` \|", table, flags=re.M))
    assert len(documented) >= 18
    assert documented - set(RULES) - set(FREE_FORM) == set()
    assert not set(RULES) & set(FREE_FORM)


def test_the_definitions_refuse_to_load_with_a_bad_backend(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update(FLYWHEEL_BACKEND="foo", FLYWHEEL_DATA_DIR=str(tmp_path / "data"), DAGSTER_HOME=str(tmp_path))
    proc = subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "FLYWHEEL_BACKEND='foo'" in output and "torch" in output and "mlx" in output, output
