"""The `flywheel` command (console script; also `python -m outcome_flywheel.cli`).

    flywheel status [--min-new-pairs N]          the preference flywheel's training status, as JSON
    flywheel style-score --orders JSON|@FILE [--context JSON] [--text NOTE] [--adapter DIR]
                                                 a proposal's style-match score against the latest adapter
    flywheel make-audit-log [--operator sector] [--n 200] [--seed 7] [--out PATH]
                                                 a synthetic operator's audit log (stdout by default)
    flywheel make-world --kind news|inverted|null [--seed 0] [--move-pct 2] ... --out PATH [--synthetic-days 60 --archive-out DIR]
                                                 a SYNTHETIC price file (and feed archive) where the answer is known
    flywheel check-settings                      validate the FLYWHEEL_* environment variables
    flywheel export SOURCE OUT [--gguf auto|always|never]   a checkpoint or adapter as a standalone HF folder (+ GGUF)

Bad input (a malformed argument, a setting the project cannot use, a missing file) prints one line
`flywheel: error: ...` on stderr and exits 2 (the input) or 1 (a file or a failure), without a
traceback. Library progress bars, logging below ERROR and Python warnings are silenced while a
command runs; `--verbose` keeps them and shows the traceback of an unexpected error.

The Dagster-free commands only: the demo and the backfill (which need the Dagster layers) stay
`python -m scripts.<name>`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from outcome_flywheel.cli_arguments import (
    KNOWN_VARIABLES,
    PROG,
    CliError,
    UsageError,
    _audit_log_size,
    _finite,
    _json_object,
    _one_line,
    _parse_json,
    _Parser,
    _positive_int,
    quiet_libraries,
    require_device,
    require_settings,
    unknown_variables,
)
from outcome_flywheel.settings import DEFAULTS, SECRETS, SettingsError, settings_problems

# The variables each command reads (validated before it runs; `check-settings` validates them all).
STATUS_VARIABLES = ("FLYWHEEL_DATA_DIR", "FLYWHEEL_MIN_NEW_PAIRS", "FLYWHEEL_PREFERENCE_CONTEXT")


STYLE_VARIABLES = (
    "FLYWHEEL_DATA_DIR",
    "FLYWHEEL_BASE_MODEL",
    "FLYWHEEL_BACKEND",
    "FLYWHEEL_DEVICE",
    "FLYWHEEL_DTYPE",
    "FLYWHEEL_SEED",
    "FLYWHEEL_PREFERENCE_CONTEXT",
)


# -- the commands' functions (also used from Python) ---------------------------------------------
def flywheel_status(warehouse=None, min_new_pairs: int | None = None) -> dict[str, Any]:
    """n_preferences, n_dpo_pairs, n_holdout, new pairs since the last adapter, ready_to_train with
    the blocking reasons, the last holdout evaluation and drift (FLYWHEEL_DATA_DIR's warehouse)."""
    from outcome_flywheel.preferences.status import training_status
    from outcome_flywheel.storage import Warehouse

    return training_status(warehouse or Warehouse.from_env(), min_new_pairs)


def style_score(
    orders: Sequence[Mapping[str, Any]],
    context: Mapping[str, Any] | None = None,
    text: str | None = None,
    adapter_path: str | Path | None = None,
    model_backend=None,
    warehouse=None,
) -> dict[str, Any]:
    """Score one proposal (its orders, the decision context) with the latest (or the given) adapter:
    {available, style_match_score, margin_logp, comment, adapter_path}.

    margin_logp = the adapter's DPO implicit reward of the rendered plan minus that of holding;
    style_match_score = sigmoid(beta * margin): P(operator prefers the plan to holding)
    (outcome_flywheel/preferences/style_match.py). `available` is false when no adapter exists yet; a
    given `adapter_path` that does not exist raises FileNotFoundError."""
    from outcome_flywheel.preferences.style_scorer import StyleScorer
    from outcome_flywheel.storage import Warehouse

    return StyleScorer(warehouse or Warehouse.from_env(), model_backend).score(orders, context, text, adapter_path)


def parse_orders(value: str) -> list[dict[str, Any]]:
    """--orders: a JSON list of {symbol, side, weight} (weight a fraction, 0.05 = 5%), or @file.json."""
    from pydantic import ValidationError

    from outcome_flywheel.preferences.audit_log import Order

    orders = _parse_json(value, "--orders")
    if not isinstance(orders, list):
        raise UsageError(
            f"--orders must be a JSON list of {{symbol, side, weight}} objects, not a {type(orders).__name__}"
        )
    if not orders:
        raise UsageError("--orders holds no orders: a proposal needs at least one order to score against holding")
    valid = []
    for i, order in enumerate(orders, start=1):
        if not isinstance(order, dict):
            raise UsageError(
                f'--orders item {i} is not an object like {{"symbol": "MSFT", "side": "buy", "weight": 0.02}}'
            )
        try:
            valid.append(Order.model_validate(order).model_dump(mode="json"))
        except ValidationError as err:
            why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'order'}: {e['msg']}" for e in err.errors())
            raise UsageError(f"--orders item {i} ({json.dumps(order)}): {_one_line(why)}") from None
    return valid


# -- commands ----------------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    from outcome_flywheel.storage import Warehouse

    require_settings(STATUS_VARIABLES)
    warehouse = Warehouse.from_env()
    if not warehouse.root.is_dir():
        raise CliError(
            f"data dir {warehouse.root} does not exist (FLYWHEEL_DATA_DIR; the demo or the Dagster assets create it)"
        )
    print(json.dumps(flywheel_status(warehouse, args.min_new_pairs), indent=2, default=str))
    return 0


def cmd_style_score(args: argparse.Namespace) -> int:
    require_settings(STYLE_VARIABLES)
    orders = parse_orders(args.orders)
    context = _json_object(args.context, "--context")
    require_device(os.environ.get("FLYWHEEL_DEVICE") or DEFAULTS["FLYWHEEL_DEVICE"])
    print(json.dumps(style_score(orders, context, args.text, args.adapter)))
    return 0


def cmd_make_audit_log(args: argparse.Namespace) -> int:
    from outcome_flywheel.preferences.synthetic import generate, write

    if args.out in (None, "-"):
        sys.stdout.write("\n".join(generate(args.n, args.seed, args.operator)) + "\n")
        return 0
    out = Path(args.out).expanduser()
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; give a file path")
    try:
        write(out, args.n, args.seed, args.operator)
    except OSError as err:
        raise CliError(f"cannot write {out}: {_one_line(err.strerror or err)}") from None
    print(f"wrote {out} ({len(out.read_text().splitlines())} lines, operator {args.operator})")
    return 0


def cmd_make_world(args: argparse.Namespace) -> int:
    from outcome_flywheel.daily_rl.worlds import prices as worlds
    from outcome_flywheel.daily_rl.worlds import synthetic_feeds as world_feeds
    from outcome_flywheel.settings import env

    require_settings(("FLYWHEEL_FEEDS_ARCHIVE", "FLYWHEEL_TIMEZONE"))
    archive, tz = (
        args.archive or os.environ.get("FLYWHEEL_FEEDS_ARCHIVE") or world_feeds.DEFAULT_ARCHIVE,
        env("FLYWHEEL_TIMEZONE"),
    )
    try:
        out = worlds.check_world_path(Path(args.out).expanduser())
        if (args.synthetic_days is None) != (args.archive_out is None):
            raise ValueError(
                "give --synthetic-days and --archive-out together (a SYNTHETIC archive of N days, written to DIR)"
            )
        config = worlds.WorldConfig(
            kind=args.kind,
            seed=args.seed,
            move_pct=args.move_pct,
            noise_pct=args.noise_pct,
            drift_pct=args.drift_pct,
            market_beta=args.market_beta,
        )
        if args.synthetic_days is not None:  # from the event templates of --archive
            feeds = world_feeds.write_synthetic_archive(
                args.archive_out,
                args.synthetic_days,
                args.headlines_per_day,
                args.seed,
                template_archive=archive,
                prices_file=args.template,
                tz=tz,
            )
            archive = args.archive_out
            print(
                f"wrote {archive} (SYNTHETIC feeds, {feeds['headlines']} headlines): use it with FLYWHEEL_FEEDS_ARCHIVE={archive}"
            )
    except ValueError as err:
        raise UsageError(str(err)) from None
    prices, manifest = worlds.make_world(config, archive, args.template, tz, args.max_headlines)
    try:
        manifest = worlds.write_world(out, prices, manifest)
    except OSError as err:
        raise CliError(f"cannot write {out}: {_one_line(err.strerror or err)}") from None
    print(
        f"wrote {out} (SYNTHETIC {config.kind} world, seed {config.seed}: {manifest['rows']} closes {manifest['first_date']}.."
        f"{manifest['last_date']}, {manifest['planted_moves']} planted moves) and {worlds.manifest_path(out)}; FLYWHEEL_PRICES_FILE={out}"
    )
    return 0


def cmd_check_settings(args: argparse.Namespace) -> int:
    problems = settings_problems() + unknown_variables()
    if problems:
        for problem in problems:
            _error(problem)
        return 2
    set_here = sorted(n for n in KNOWN_VARIABLES if os.environ.get(n))
    print(
        f"settings ok: {len(set_here)} FLYWHEEL_* variable{'s' if len(set_here) != 1 else ''} set, the rest at their defaults"
    )
    for name in set_here:
        print(f"  {name}={'<hidden>' if name in SECRETS else os.environ[name]}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from outcome_flywheel.models.loader import ModelLoader
    from outcome_flywheel.models.serve.export import ExportError, export

    require_settings(STYLE_VARIABLES)  # the model loader's variables
    try:
        print(export(args.source, args.out, ModelLoader.from_env(), args.gguf, args.gguf_type)[1])
    except ExportError as err:
        raise CliError(str(err)) from None
    return 0


def build_parser() -> argparse.ArgumentParser:
    from outcome_flywheel.preferences.synthetic import OPERATORS

    parser = _Parser(
        prog=PROG,
        description="Command-line tools of the outcome flywheel (Dagster-free).",
        epilog="Each command reads the FLYWHEEL_* variables (README: Configuration).",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="keep library warnings and progress bars; tracebacks on unexpected errors",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    p = sub.add_parser(
        "status",
        help="training status of the preference flywheel (JSON)",
        description="n_preferences, n_dpo_pairs, n_holdout, new pairs since the last adapter, ready_to_train "
        "with the blocking reasons, the last holdout evaluation and drift, from FLYWHEEL_DATA_DIR.",
    )
    p.add_argument("--min-new-pairs", type=_positive_int, default=None, help="default FLYWHEEL_MIN_NEW_PAIRS (10)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "style-score",
        help="style-match score of a proposal against the latest preference adapter (JSON)",
        description="Prints {available, style_match_score, margin_logp, comment, adapter_path}: "
        "score = sigmoid(beta * margin), margin = the adapter's DPO implicit reward of the plan "
        "minus that of holding. available is false before the first adapter.",
    )
    p.add_argument(
        "--orders", required=True, help='JSON list of {"symbol", "side": buy|sell, "weight": 0.05 = 5%%}, or @file.json'
    )
    p.add_argument(
        "--context",
        default="{}",
        help="JSON object (or @file.json): the decision context; its keys count only "
        "if the adapter was trained with them (FLYWHEEL_PREFERENCE_CONTEXT)",
    )
    p.add_argument("--text", default=None, help="the proposal's optional note")
    p.add_argument(
        "--adapter", default=None, help="adapter folder (default: $FLYWHEEL_DATA_DIR/adapters/preference/latest)"
    )
    p.set_defaults(func=cmd_style_score)

    p = sub.add_parser(
        "make-audit-log",
        help="a synthetic operator's audit log (JSONL)",
        description="Decisions of a synthetic operator on rebalance proposals, with the log's edge cases "
        "(outcome_flywheel/preferences/synthetic.py). The bundled sample is "
        "--operator sector --n 200 --seed 7 --out sample_data/audit_log.jsonl.",
    )
    p.add_argument("--operator", choices=sorted(OPERATORS), default="sector")
    p.add_argument("--n", type=_audit_log_size, default=200, help="decisions (default 200)")
    p.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    p.add_argument("--out", default="-", help="file to write (default -: stdout)")
    p.set_defaults(func=cmd_make_audit_log)

    p = sub.add_parser(
        "make-world",
        help="a SYNTHETIC price file where the answer is known (news, inverted, null)",
        description="Closes over the template price file's dates and symbols, each a seeded random walk; in `news` each "
        "headline's company moves --move-pct with its news the session after its note's entry, in `inverted` against "
        "it, in `null` never. Writes PATH and PATH.world.json; --synthetic-days first writes a SYNTHETIC archive to "
        "--archive-out and builds the world over it (docs/daily_rl.md, Worlds).",
    )
    p.add_argument("--kind", choices=("news", "inverted", "null"), required=True, help="the rule")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="random seed (default 0): the walks (the same in every kind), the synthetic archive",
    )
    p.add_argument("--move-pct", type=_finite, default=2.0, help="size of a planted move, %% of the close (default 2)")
    p.add_argument(
        "--noise-pct", type=_finite, default=1.0, help="daily standard deviation of every return, %% (default 1)"
    )
    p.add_argument("--drift-pct", type=_finite, default=0.0, help="mean daily return of every symbol, %% (default 0)")
    p.add_argument(
        "--market-beta",
        type=_finite,
        default=1.0,
        help="each stock's exposure to SPY's noise (default 1: vs_spy is the planted move plus the stock's own noise; 0: stocks walk apart from SPY)",
    )
    p.add_argument(
        "--archive",
        default=None,
        help="feed archive (default FLYWHEEL_FEEDS_ARCHIVE); with --synthetic-days, the templates'",
    )
    p.add_argument(
        "--max-headlines",
        type=_positive_int,
        default=None,
        help="plant moves for each day's first N headlines (as the loop reads)",
    )
    p.add_argument(
        "--template",
        default="sample_data/prices/daily_close.csv",
        help="price file of the dates, symbols, first closes",
    )
    p.add_argument(
        "--synthetic-days",
        type=_positive_int,
        default=None,
        help="write a SYNTHETIC archive of N days to --archive-out",
    )
    p.add_argument(
        "--headlines-per-day",
        type=_positive_int,
        default=16,
        help="the SYNTHETIC archive's headlines a day (default 16)",
    )
    p.add_argument(
        "--archive-out",
        default=None,
        help="the SYNTHETIC archive's folder (DIR/YYYY-MM-DD/*.xml, DIR/synthetic_archive.json)",
    )
    p.add_argument("--out", required=True, help="the .csv file to write")
    p.set_defaults(func=cmd_make_world)

    p = sub.add_parser(
        "check-settings",
        help="validate the FLYWHEEL_* environment variables",
        description="One line per variable that breaks its rule (and per FLYWHEEL_* name the project "
        "does not read); exit 2 when any, 0 when all are usable.",
    )
    p.set_defaults(func=cmd_check_settings)

    p = sub.add_parser(
        "export", help="a policy checkpoint or preference adapter as a standalone Hugging Face folder, and GGUF"
    )
    p.add_argument(
        "source", help="policy | preference (the latest, as /v1 serves them) | a checkpoint, adapter or model folder"
    )
    p.add_argument(
        "out",
        help="the folder to write: safetensors with the LoRA merged (PEFT), then OUT/model.gguf via llama.cpp (docs/serving.md)",
    )
    p.add_argument(
        "--gguf", choices=("auto", "always", "never"), default="auto", help="auto: when the converter is installed"
    )
    p.add_argument(
        "--gguf-type", choices=("f32", "f16", "bf16", "q8_0"), default="f16", help="GGUF weights (default f16)"
    )
    p.set_defaults(func=cmd_export)
    return parser


# -- running -------------------------------------------------------------------------------------------
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("outcome-flywheel")
    except PackageNotFoundError:
        return "unknown"


def _error(message: str) -> None:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (the console script exits with it)."""
    verbose = False
    try:
        with warnings.catch_warnings():
            args = build_parser().parse_args(argv)
            verbose = args.verbose
            if not verbose:
                quiet_libraries()
            return args.func(args)
    except CliError as err:
        _error(str(err))
        return err.code
    except SettingsError as err:
        _error(str(err))
        return 2
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError) as err:
        if verbose:
            raise
        _error(str(err))
        return 1
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:  # e.g. `flywheel make-audit-log | head`
        sys.stdout = open(os.devnull, "w")
        return 1
    except Exception as err:  # a bug or a broken file: still one line, the traceback with --verbose
        if verbose:
            raise
        _error(f"{type(err).__name__}: {err} (run with --verbose for the traceback)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
