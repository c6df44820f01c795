"""Honesty benchmark of the preference flywheel on tiny-local.

1. Random labels: the bundled proposals with approve / reject drawn at random (no preference to
   learn). The whole method runs (T+5 outcomes, weighting, weighted DPO, holdout scoring); the
   holdout AUC's 95% interval should cover 0.5 and the label should say "no useful signal yet".
2. The sample operator (`sample_data/audit_log.jsonl`, a consistent sector preference): holdout
   AUC should be >= 0.65.
Both at the project defaults (WeightedDPOConfig: TRL's lr 5e-5, beta 0.1, 3 epochs, LoRA r=8).
Optionally (`--compare-lr 2e-3 --compare-epochs 8`) the sample operator again at other settings.

    python -m benchmarks.flywheel_auc [--threads 1] [--compare-lr LR --compare-epochs N]

Prints the figures; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import pandas as pd

from assets.flywheel.audit_log import load_orders, parse_file, records_frame
from assets.flywheel.metrics import auc_report
from assets.flywheel.scoring import score_holdout, training_pairs
from assets.flywheel.weighting import build_pairs
from assets.flywheel.windows import PriceTable, compute_outcome
from resources.audit_log import BUNDLED_AUDIT_LOG
from resources.market_data import BUNDLED_PRICES, read_price_file
from resources.models.tiny_local import cached_tiny_local
from resources.models.weighted_dpo import WeightedDPOConfig


def tiny_local_dir() -> Path:
    return cached_tiny_local()


def decisions_and_outcomes(log_path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    decisions = records_frame(parse_file(log_path), "America/New_York")
    prices = PriceTable(read_price_file(BUNDLED_PRICES))
    rows = []
    for r in decisions.itertuples(index=False):
        out = compute_outcome(r.ts_utc, load_orders(r.proposal_orders_json), prices)
        out["decision_id"] = r.decision_id
        rows.append(out)
    return decisions, pd.DataFrame(rows)


def randomise(decisions: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Same proposals, approve / reject at random: there is nothing to learn."""
    rng = random.Random(seed)
    out = decisions.copy()
    out["decision"] = [rng.choice(["approve", "reject"]) for _ in range(len(out))]
    out["operator_orders_json"] = None
    return out


def run_once(model_dir: Path, decisions: pd.DataFrame, outcomes: pd.DataFrame, config: WeightedDPOConfig) -> dict:
    from resources.models.torch_backend import TorchBackend

    pairs, _ = build_pairs(decisions, outcomes)
    backend = TorchBackend(model_dir, device="cpu")
    t0 = time.perf_counter()
    stats = backend.train_weighted_dpo(training_pairs(pairs), config)
    train_s = time.perf_counter() - t0
    scored = score_holdout(backend, pairs)
    report = auc_report(scored["style_match_score"].to_numpy(), (scored["decision"] == "approve").to_numpy())
    by_decision = scored.groupby("decision")["style_match_score"].mean().round(4).to_dict()
    return {
        **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in report.as_dict().items()},
        "n_train_pairs": int((pairs["split"] == "train").sum()),
        "learning_rate": config.learning_rate, "epochs": config.epochs, "steps": stats.steps,
        "loss_first": round(stats.losses[0], 4), "loss_last_epoch": round(sum(stats.losses[-(stats.steps // config.epochs):]) / (stats.steps // config.epochs), 4),
        "mean_score_by_decision": by_decision, "train_s": round(train_s, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 avoids oversubscription on a busy 2-core box)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare-lr", type=float, default=None, help="also train the sample operator at this lr")
    parser.add_argument("--compare-epochs", type=int, default=None)
    parser.add_argument("--random-repeats", type=int, default=1, help="random-label runs (different labels each)")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = tiny_local_dir()
    config = WeightedDPOConfig(seed=args.seed)
    decisions, outcomes = decisions_and_outcomes(BUNDLED_AUDIT_LOG)

    results = {}
    repeats = []
    for k in range(max(1, args.random_repeats)):
        rk = run_once(model_dir, randomise(decisions, args.seed + 1 + k), outcomes, config)
        print(f"random labels #{k}: AUC {rk['auc']:.3f} [{rk['auc_low']:.3f}, {rk['auc_high']:.3f}] n={rk['n_holdout']} -> {rk['label']}  (train {rk['train_s']}s)")
        repeats.append(rk)
    results["random_labels"] = r = repeats[0]
    if len(repeats) > 1:
        results["random_repeats"] = [{k: x[k] for k in ("auc", "auc_low", "auc_high", "label")} for x in repeats]
        results["random_repeats_covering_half"] = sum(x["auc_low"] <= 0.5 <= x["auc_high"] for x in repeats)
    results["sample_operator"] = run_once(model_dir, decisions, outcomes, config)
    s = results["sample_operator"]
    print(f"sample operator: AUC {s['auc']:.3f} [{s['auc_low']:.3f}, {s['auc_high']:.3f}] n={s['n_holdout']} -> {s['label']}  (lr {config.learning_rate}, {config.epochs} epochs, train {s['train_s']}s)")
    if args.compare_lr or args.compare_epochs:
        other = WeightedDPOConfig.with_overrides(learning_rate=args.compare_lr, epochs=args.compare_epochs, seed=args.seed)
        results["sample_operator_compare"] = d = run_once(model_dir, decisions, outcomes, other)
        print(f"sample operator at lr {other.learning_rate}, {other.epochs} epochs: AUC {d['auc']:.3f} [{d['auc_low']:.3f}, {d['auc_high']:.3f}] -> {d['label']}")
    results["random_ci_covers_half"] = bool(r["auc_low"] <= 0.5 <= r["auc_high"])
    results["random_label_is_no_signal"] = r["label"] == "no useful signal yet"
    results["sample_auc_at_least_0_65"] = bool(s["auc"] >= 0.65)
    print(json.dumps(results, default=str))
    return results


if __name__ == "__main__":
    main()
