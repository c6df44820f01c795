"""Which side does one policy checkpoint (or the base) take on headlines it never trained on? In a SYNTHETIC world
(`flywheel make-world`) the right side of a call on the headline's company is its news' side (`news`) or the
opposite one (`inverted`). This samples `--notes` notes per held-out headline (the archive days after the first
`--train-days`, the `headlines` asset's own pick of `--headlines` a day) with the daily loop's sampling
settings (`ROLLOUT_SAMPLING`: temperature 0.8, top-p 0.95, top-k 50; transformers' `generate`), under
FLYWHEEL_NOTE_FORMAT, reads their calls, and prints per world the
share of company calls on the right side, with a 95% interval clustered by headline, and the share of notes
that call the headline's company.

It is `outcome_learning`'s held-out side accuracy without the rest of the held-out loop (judging, the gate, the
A/B): for a run whose held-out days did not fit its time (a SmolLM2 world-run's 16 days take hours on a 2-core
CPU), evaluated on the checkpoint that its training days left (DIR = a `checkpoints/policy/<day>` folder).

    python -m benchmarks.heldout_sides --checkpoint DIR|base [--worlds news,inverted]
        [--model smollm2-135m-instruct] [--days 16] [--train-days 11] [--headlines 4] [--notes 16]
        [--max-new-tokens 64] [--seed 0] [--record]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks._daily_common import archive_days, resources
from benchmarks._grid_table import RULE_SIGN, SIDE_SIGN
from benchmarks._results import add_record_argument, finish

WORLDS = ("news", "inverted")  # the worlds with a right side (RULE_SIGN: the news' side times its sign)


def held_out_headlines(root: Path, days: list[str], headlines: int) -> pd.DataFrame:
    """The `headlines` asset's rows for `days` (its pick and caps, as the loop reads them), materialised into `root`."""
    import dagster as dg

    from assets.daily_rl.headlines import headlines as headlines_asset

    res = resources(root, headlines)
    for day in days:
        assert dg.materialize([headlines_asset], partition_key=day, resources=res).success, day
    return pd.concat([res["warehouse"].read("headlines", d) for d in days], ignore_index=True)


def sample_notes(model_dir: Path, checkpoint: str, heads: pd.DataFrame, notes: int, max_new_tokens: int, seed: int):
    """`notes` sampled notes per headline from the base at `model_dir`, with the LoRA adapter at `checkpoint` on it
    unless that is `base`; one seed per headline, so base and policy draw the same uniforms."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_SAMPLING
    from outcome_flywheel.models.prompts import trading_note_messages

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if checkpoint != "base":
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, checkpoint).eval()
    rows = []
    for i, head in heads.iterrows():
        prompt = tokenizer.apply_chat_template(
            trading_note_messages(head["title"], head["summary"]),
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        torch.manual_seed(seed * 100_003 + i)
        with torch.no_grad():
            out = model.generate(
                **{k: v.repeat(notes, 1) for k, v in prompt.items()},
                do_sample=True,
                temperature=ROLLOUT_SAMPLING.temperature,
                top_p=ROLLOUT_SAMPLING.top_p,
                top_k=ROLLOUT_SAMPLING.top_k,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
        start = prompt["input_ids"].shape[1]
        rows += [
            dict(headline_id=head["headline_id"], note=tokenizer.decode(row[start:], skip_special_tokens=True))
            for row in out
        ]
    return pd.DataFrame(rows)


def side_table(notes: pd.DataFrame, heads: pd.DataFrame, world: str, n_boot: int = 2000) -> dict:
    """Side accuracy of the company calls (on headlines with news), its clustered interval, and the company share."""
    from outcome_flywheel.daily_rl.evaluation.clustered import clustered_interval
    from outcome_flywheel.daily_rl.notes.calls import parse_call
    from outcome_flywheel.daily_rl.notes.relevance import headline_symbols
    from outcome_flywheel.daily_rl.worlds.news import news_direction

    by_id = heads.set_index("headline_id")
    rows = []
    for head_id, note in zip(notes["headline_id"], notes["note"]):
        head = by_id.loc[head_id]
        call = parse_call(note)
        company = call.parse_status == "ok" and call.symbol in headline_symbols(head["title"], head["summary"])
        right = news_direction(head["title"], head["summary"]) * RULE_SIGN[world]
        correct = float(SIDE_SIGN.get(call.side, 0) == right) if company and right else np.nan
        rows.append(dict(headline_id=head_id, company=company, correct=correct))
    frame = pd.DataFrame(rows)
    judged = frame.dropna(subset=["correct"])
    accuracy = (
        clustered_interval(judged, lambda f: float(f["correct"].mean()), cluster="headline_id", n_boot=n_boot)
        if len(judged)
        else None
    )
    return dict(
        # an interval of one headline is undefined: None, not NaN (the line stays strict JSON)
        side_accuracy=accuracy
        and {
            k: (None if isinstance(v, float) and np.isnan(v) else v)
            for k, v in accuracy.items()
            if k in ("estimate", "low", "high", "clusters", "n")
        },
        company_calls=int(frame["company"].sum()),
        notes=len(frame),
        company_share=round(float(frame["company"].mean()), 4) if len(frame) else None,
    )


def add_held_out_arguments(parser: argparse.ArgumentParser, days: int, headlines: int) -> None:
    """The arguments naming a run's held-out headlines and the model that reads them (this and side_margin)."""
    parser.add_argument("--model", default="smollm2-135m-instruct", help="tiny-local, smollm2-135m-instruct")
    parser.add_argument("--days", type=int, default=days, help="archive days from its first (as the run's)")
    parser.add_argument("--train-days", type=int, default=11, help="the run's training days; the rest are held out")
    parser.add_argument("--headlines", type=int, default=headlines, help="headlines a day (as the run's world planted)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out-dir", default=None, help="where the headlines' data dir goes (default: a temp folder)")


def held_out_set(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Path, list[str], pd.DataFrame]:
    """(the model's folder, the held-out days, their headlines) for `add_held_out_arguments`' arguments."""
    import torch

    from benchmarks.outcome_learning import model_data_dir
    from outcome_flywheel.cli_arguments import quiet_libraries

    if not 0 < args.train_days < args.days:
        parser.error(f"--train-days must be between 1 and --days - 1, got {args.train_days} of {args.days}")
    torch.set_num_threads(args.threads)
    quiet_libraries()
    root = Path(args.out_dir or tempfile.mkdtemp(prefix="flywheel-heldout-")) / "data"
    data = model_data_dir(root, args.model)
    days = archive_days(args.days)[args.train_days :]
    return data / "models" / args.model, days, held_out_headlines(data, days, args.headlines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--checkpoint", required=True, help="a checkpoints/policy/<day> folder (a LoRA adapter) or base"
    )
    parser.add_argument("--worlds", default="news,inverted", help="comma-separated: news, inverted")
    add_held_out_arguments(parser, days=16, headlines=4)
    parser.add_argument("--notes", type=int, default=16, help="notes sampled per headline")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    add_record_argument(parser)
    args = parser.parse_args()
    from outcome_flywheel.settings import env

    worlds = [w.strip() for w in args.worlds.split(",") if w.strip()]
    if not worlds or set(worlds) - set(WORLDS):
        parser.error(f"--worlds: choose from {', '.join(WORLDS)}, got {args.worlds!r}")
    if args.checkpoint != "base" and not (Path(args.checkpoint) / "adapter_config.json").is_file():
        parser.error(f"--checkpoint {args.checkpoint}: not a LoRA checkpoint folder (no adapter_config.json), nor base")
    started = time.perf_counter()
    model_dir, days, heads = held_out_set(parser, args)
    notes = sample_notes(model_dir, args.checkpoint, heads, args.notes, args.max_new_tokens, args.seed)
    result = dict(
        checkpoint=args.checkpoint,
        model=args.model,
        note_format=env("FLYWHEEL_NOTE_FORMAT"),
        held_out_days=days,
        headlines=len(heads),
        worlds={w: side_table(notes, heads, w) for w in worlds},
        seconds=round(time.perf_counter() - started, 1),
    )
    finish("heldout_sides", result, args.record)


if __name__ == "__main__":
    main()
