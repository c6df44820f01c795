"""Does the preference flywheel learn an operator, any operator? Holdout AUC over synthetic operators.

Each operator (`outcome_flywheel/preferences/synthetic.py`, `flywheel make-audit-log --operator`) decides ~240 rebalance proposals by one rule:
  sector  the bundled sample: likes three sectors' plans;
  ticker  approves a basket holding a name of its watchlist (two names per sector);
  size    approves when no order is above 5% of the portfolio;
  mix     sector or size, with 15% noise;
  random  coin flips: nothing to learn, so its AUC must be labelled "no useful signal yet".
For each: the whole method on tiny-local (T+5 outcomes on the bundled prices, outcome weighting
with swaps, weighted DPO with LoRA, holdout scoring), then the holdout approval AUC with its
bootstrap 95% interval and label. Goal: every consistent operator >= 0.65.

    python -m benchmarks.flywheel_auc [--operators sector,ticker,...] [--n 240] [--data-seeds 7]
        [--threads 1] [--baseline]

`--baseline` also runs each operator at the settings before issue 8 (TRL's DPO defaults: lr 5e-5,
beta 0.1, 3 epochs, each plan scored as one sequence, mean-token margin, every context key in the
prompt). Prints a table; the last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks._results import add_record_argument, finish
from outcome_flywheel.market_data import BUNDLED_PRICES, read_price_file
from outcome_flywheel.models.provision.tiny_local import cached_tiny_local
from outcome_flywheel.models.train.dpo import train_weighted_dpo
from outcome_flywheel.models.train.dpo_config import WeightedDPOConfig
from outcome_flywheel.preferences.audit_log import load_orders, parse_file, records_frame
from outcome_flywheel.preferences.metrics import LABEL_NONE, USEFUL, auc_report, sigmoid
from outcome_flywheel.preferences.style_match import score_holdout, training_pairs
from outcome_flywheel.preferences.synthetic import CONSISTENT, OPERATORS, write
from outcome_flywheel.preferences.weighting import build_pairs
from outcome_flywheel.preferences.windows import compute_outcome
from outcome_flywheel.trading_sessions import PriceTable

# Issue 8's starting point, kept to show what changed (its prompt held every context key and the note).
BASELINE = {"learning_rate": 5e-5, "beta": 0.1, "epochs": 3, "completion_unit": "sequence"}
BASELINE_CONTEXT = ("*",)


def decisions_and_outcomes(log_path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    decisions = records_frame(parse_file(log_path), "America/New_York")
    prices = PriceTable(read_price_file(BUNDLED_PRICES))
    rows = []
    for r in decisions.itertuples(index=False):
        out = compute_outcome(r.ts_utc, load_orders(r.proposal_orders_json), prices)
        out["decision_id"] = r.decision_id
        rows.append(out)
    return decisions, pd.DataFrame(rows)


def _mean_token_margin_scores(backend, pairs: pd.DataFrame) -> pd.DataFrame:
    """The pre-issue-8 score: sigmoid(mean token logp under the adapter minus under the base)."""
    hold = pairs[pairs["split"] == "holdout"].sort_values("decision_id").reset_index(drop=True)
    responses = [backend.encode_response(c) for c in hold["proposal_plan"]]
    prompts = [json.loads(p) for p in hold["prompt"]]
    adapted = backend.response_logprobs(prompts, responses, use_adapter=True)
    base = backend.response_logprobs(prompts, responses, use_adapter=False)
    out = hold[["decision_id", "decision"]].copy()
    out["style_match_score"] = [sigmoid(float(np.mean(a)) - float(np.mean(b))) for a, b in zip(adapted, base)]
    return out


def run_operator(
    model_dir: Path,
    log_path: Path,
    config: WeightedDPOConfig,
    context_keys: tuple[str, ...] = (),
    baseline: bool = False,
) -> dict:
    """Train on the log's training split, score its holdout; the AUC report and counts."""
    from outcome_flywheel.models.torch.backend import TorchBackend

    decisions, outcomes = decisions_and_outcomes(log_path)
    pairs, _ = build_pairs(decisions, outcomes, context_keys=context_keys)
    backend = TorchBackend(model_dir, device="cpu")
    t0 = time.perf_counter()
    stats = train_weighted_dpo(backend, training_pairs(pairs), config)
    train_s = time.perf_counter() - t0
    if baseline:
        scored = _mean_token_margin_scores(backend, pairs)
    else:
        scored = score_holdout(backend, pairs, config.completion_unit, config.beta)
    report = auc_report(scored["style_match_score"].to_numpy(), (scored["decision"] == "approve").to_numpy())
    per_epoch = max(1, stats.steps // config.epochs)
    return {
        **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in report.as_dict().items()},
        "n_decisions": int(len(decisions)),
        "n_train_pairs": int((pairs["split"] == "train").sum()),
        "swapped_share": round(float(pairs.loc[pairs["split"] == "train", "swapped"].mean()), 3),
        "loss_first": round(stats.losses[0], 4),
        "loss_last_epoch": round(float(np.mean(stats.losses[-per_epoch:])), 4),
        "train_s": round(train_s, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--operators", default=",".join(OPERATORS), help="comma-separated, from: " + ", ".join(OPERATORS)
    )
    parser.add_argument("--n", type=int, default=240, help="decisions per operator")
    parser.add_argument("--data-seeds", default="7", help="comma-separated audit-log seeds (7 = the bundled sample's)")
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (1 avoids oversubscription on a busy 2-core box)"
    )
    parser.add_argument(
        "--context-keys",
        default="",
        help="decision-context keys in the prompt, as FLYWHEEL_PREFERENCE_CONTEXT (default none; * = all and the note)",
    )
    parser.add_argument("--baseline", action="store_true", help="also run the settings before issue 8")
    add_record_argument(parser)
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    operators = [o for o in args.operators.split(",") if o]
    unknown = sorted(set(operators) - set(OPERATORS))
    if unknown:
        parser.error(f"unknown operators {unknown}; choose from {sorted(OPERATORS)}")
    data_seeds = [int(s) for s in args.data_seeds.split(",")]
    model_dir = cached_tiny_local()
    keys = tuple(k.strip() for k in args.context_keys.split(",") if k.strip())
    settings = {"defaults": (WeightedDPOConfig(seed=args.seed), keys)}
    if args.baseline:
        settings["baseline"] = (WeightedDPOConfig(seed=args.seed, **BASELINE), BASELINE_CONTEXT)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for operator in operators:
            for data_seed in data_seeds:
                log = write(Path(tmp) / f"{operator}-{data_seed}.jsonl", args.n, data_seed, operator)
                for name, (config, context_keys) in settings.items():
                    r = run_operator(model_dir, log, config, context_keys, baseline=name == "baseline")
                    r.update(operator=operator, data_seed=data_seed, settings=name)
                    rows.append(r)
                    print(
                        f"{operator:7s} seed {data_seed:3d} {name:9s} AUC {r['auc']:.3f} [{r['auc_low']:.3f}, {r['auc_high']:.3f}] "
                        f"n={r['n_holdout']:3d} -> {r['label']}  (train {r['train_s']}s)",
                        flush=True,
                    )

    print()
    print("| operator | data seed | settings | holdout n | AUC | 95% interval | label |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['operator']} | {r['data_seed']} | {r['settings']} | {r['n_holdout']} | {r['auc']:.3f} | [{r['auc_low']:.3f}, {r['auc_high']:.3f}] | {r['label']} |"
        )
    ours = [r for r in rows if r["settings"] == "defaults"]
    consistent = [r for r in ours if r["operator"] in CONSISTENT]
    random_rows = [r for r in ours if r["operator"] not in CONSISTENT]
    result = {
        "machine_note": "tiny-local on CPU; AUCs do not depend on the machine, train_s does",
        "config": WeightedDPOConfig(seed=args.seed).as_dict(),
        "context_keys": list(keys),
        "rows": rows,
        "min_consistent_auc": min((r["auc"] for r in consistent), default=None),
        "every_consistent_at_least_0_65": bool(consistent) and all(r["auc"] >= USEFUL for r in consistent),
        "random_labelled_no_signal": bool(random_rows) and all(r["label"] == LABEL_NONE for r in random_rows),
    }
    return finish("flywheel_auc", result, args.record, argv)


if __name__ == "__main__":
    main()
