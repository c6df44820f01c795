"""The `flywheel` command's checks of what it is given: arguments read from a flag or a file, JSON objects,
devices, sizes and finite numbers, and the FLYWHEEL_* environment (known names, required settings), each
failing with an error that names the flag or variable; and the libraries' loggers kept quiet on its output."""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from outcome_flywheel.settings import DEFAULTS, FREE_FORM, RULES, settings_problems

PROG = "flywheel"


# Loggers of the libraries a command may load; kept at ERROR unless --verbose.
LIBRARY_LOGGERS = (
    "transformers",
    "huggingface_hub",
    "peft",
    "torch",
    "accelerate",
    "tokenizers",
    "safetensors",
    "urllib3",
    "filelock",
)


KNOWN_VARIABLES = frozenset(DEFAULTS) | frozenset(RULES) | frozenset(FREE_FORM)


class CliError(Exception):
    """A failure the user can act on: reported as one line, exit `code`."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class UsageError(CliError):
    """Input the command cannot use (argparse's exit status, 2)."""

    def __init__(self, message: str):
        super().__init__(message, code=2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message and exits 2; we want one line
        raise UsageError(f"{message} (see `{self.prog} --help`)")


# -- input checks ----------------------------------------------------------------------------------
def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def require_settings(names: Sequence[str] | None = None) -> None:
    """UsageError naming the first FLYWHEEL_* variable among `names` (all when None) that breaks its rule."""
    environ = os.environ if names is None else {n: os.environ[n] for n in names if n in os.environ}
    problems = settings_problems(environ)
    if problems:
        more = f" (and {len(problems) - 1} more: run `{PROG} check-settings`)" if len(problems) > 1 else ""
        raise UsageError(problems[0] + more)


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """FLYWHEEL_* variables the project never reads (a typo leaves the default in force, silently)."""
    environ = os.environ if environ is None else environ
    lines = []
    for name in sorted(n for n in environ if n.startswith("FLYWHEEL_") and n not in KNOWN_VARIABLES):
        close = difflib.get_close_matches(name, sorted(KNOWN_VARIABLES), n=1)
        lines.append(f"{name}: not a variable the project reads" + (f" (did you mean {close[0]}?)" if close else ""))
    return lines


def _read_argument(value: str, flag: str) -> str:
    """The argument itself, or the text of the file it names as @PATH."""
    if not value.startswith("@"):
        return value
    path = Path(value[1:]).expanduser()
    try:
        return path.read_text()
    except FileNotFoundError:
        raise CliError(f"{flag} file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CliError(f"cannot read {flag} file {path}: {_one_line(err)}") from None


def _parse_json(value: str, flag: str) -> Any:
    try:
        return json.loads(_read_argument(value, flag))
    except json.JSONDecodeError as err:
        raise UsageError(f"{flag} is not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})") from None


def _json_object(value: str, flag: str) -> dict[str, Any]:
    data = _parse_json(value, flag)
    if not isinstance(data, dict):
        raise UsageError(f"{flag} must be a JSON object, not a {type(data).__name__}")
    return data


def require_device(device: str) -> None:
    """CliError when FLYWHEEL_DEVICE names an accelerator this machine's torch does not have."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise CliError(f"FLYWHEEL_DEVICE={device!r}, but torch sees no CUDA device here (use auto or cpu)")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise CliError(f"FLYWHEEL_DEVICE={device!r}, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    elif device == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise CliError("FLYWHEEL_DEVICE='mps', but torch sees no MPS device here (use auto or cpu)")


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return number


def _audit_log_size(value: str) -> int:
    number = _positive_int(value)
    if number < 20:  # the edge-case lines sit at fixed positions among the decisions
        raise argparse.ArgumentTypeError(f"{value!r} is too small: at least 20 decisions")
    return number


def _finite(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number")
    return number


def quiet_libraries() -> None:
    """No progress bars, library logging below ERROR or Python warnings (set before the libraries load;
    a variable the user set keeps its value)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # huggingface_hub's and transformers' tqdm
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.simplefilter("ignore")
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    if "transformers" in sys.modules:  # loaded already (e.g. main() called in-process)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
