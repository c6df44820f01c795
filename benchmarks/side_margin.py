"""Which side does a checkpoint lean to on each held-out headline, read without sampling? For every held-out
headline (`heldout_sides`' pick: the archive days after the first `--train-days`, `--headlines` a day) the
margin m = log pi(" Buy") - log pi(" Sell") right after "Trade Recommendation:", the line the `call_first` note
format asks the note to begin with (each side phrase's whole token sequence: SmolLM2 writes " Sell" in two).
The prompt is `--note-format`'s (default `call_first`, the prompt the CPU runs train under), not the shell's
FLYWHEEL_NOTE_FORMAT: read under another prompt than its policy's, a checkpoint's lean is off its own path
(the base leaned 1.08 / 0.31 nats on good / bad news under `sections`, 1.60 / 0.87 under `call_first`).

Per checkpoint: the mean margin on good-news and on bad-news headlines and their gap (good - bad; the `news`
rule wants it above 0, `inverted` below), and the forced-choice side accuracy under each rule (sign(m) against
the rule's side). Each checkpoint after the first gets the change of its gap from the first one's (the base by
default) with a 95% bootstrap interval over headlines, paired: the same headlines for both.

A sampled note's side is what `heldout_sides` and the loop's held-out days measure; this reads the lean behind it
in seconds, so a run's every checkpoint can be read, and a lean too small to flip a sampled side still shows.

    python -m benchmarks.side_margin --checkpoints base,DIR[,DIR...] [--model smollm2-135m-instruct]
        [--note-format call_first] [--days 26] [--train-days 11] [--headlines 8] [--n-boot 2000] [--record]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks._results import add_record_argument, finish
from benchmarks.heldout_sides import add_held_out_arguments, held_out_set
from outcome_flywheel.settings import NOTE_FORMATS

OPENING = "Trade Recommendation:"
SIDES = (" Buy", " Sell")


def side_margins(model_dir: Path, checkpoint: str, heads: pd.DataFrame, note_format: str) -> np.ndarray:
    """log pi(" Buy") - log pi(" Sell") after `OPENING`, one per headline of `heads` under the `note_format`
    prompt, from the base at `model_dir` with the LoRA adapter at `checkpoint` on it unless that is `base`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if checkpoint != "base":
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, checkpoint).eval()
    return margins_of(model, tokenizer, heads, note_format)


def margins_of(model, tokenizer, heads: pd.DataFrame, note_format: str) -> np.ndarray:
    """`side_margins` of a model already in memory (a transformers causal LM, with or without its adapter)."""
    import torch

    from outcome_flywheel.models.prompts import trading_note_messages

    sides = [tokenizer.encode(s, add_special_tokens=False) for s in SIDES]
    out = []
    for title, summary in zip(heads["title"], heads["summary"]):
        text = tokenizer.apply_chat_template(
            trading_note_messages(title, summary, note_format), add_generation_prompt=True, tokenize=False
        )
        prefix = tokenizer(text + OPENING, add_special_tokens=False)["input_ids"]
        logp = []
        for side in sides:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prefix + side])).logits[0, len(prefix) - 1 : -1]
            logp.append(float(torch.log_softmax(logits.double(), -1)[range(len(side)), side].sum()))
        out.append(logp[0] - logp[1])
    return np.array(out)


def lean_table(margins: np.ndarray, news: np.ndarray) -> dict:
    """The mean margin on good (news > 0) and bad (< 0) headlines, their gap, and the forced-choice side
    accuracy under the `news` and `inverted` rules (headlines without news left out)."""
    good, bad, judged = margins[news > 0], margins[news < 0], news != 0
    right = np.sign(margins[judged]) == news[judged]
    return dict(
        good=round(float(good.mean()), 4) if len(good) else None,
        bad=round(float(bad.mean()), 4) if len(bad) else None,
        gap=round(float(good.mean() - bad.mean()), 4) if len(good) and len(bad) else None,
        accuracy={"news": round(float(right.mean()), 4), "inverted": round(float(1 - right.mean()), 4)}
        if judged.any()
        else None,
        headlines=int(judged.sum()),
    )


def gap_change(first: np.ndarray, other: np.ndarray, news: np.ndarray, n_boot: int, seed: int = 0) -> dict | None:
    """other's gap minus first's, and its 95% bootstrap interval over headlines (the same draws for both); None
    without both good and bad news (no gap to change)."""
    if not ((news > 0).any() and (news < 0).any()):
        return None

    def gap(m, idx):
        n = news[idx]
        return m[idx][n > 0].mean() - m[idx][n < 0].mean()

    judged = np.flatnonzero(news != 0)
    draws = np.random.default_rng(seed).choice(judged, size=(n_boot, len(judged)))
    changes = [gap(other, d) - gap(first, d) for d in draws if (news[d] > 0).any() and (news[d] < 0).any()]
    low, high = np.percentile(changes, [2.5, 97.5]) if changes else (np.nan, np.nan)
    estimate = gap(other, judged) - gap(first, judged)
    return {"estimate": round(float(estimate), 4), "low": round(float(low), 4), "high": round(float(high), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", required=True, help="comma-separated: base and checkpoints/policy/<day> dirs")
    parser.add_argument(
        "--note-format",
        choices=NOTE_FORMATS,
        default="call_first",
        help="the prompt the margins are read under: the one the checkpoints were trained under (default call_first)",
    )
    add_held_out_arguments(parser, days=26, headlines=8)
    parser.add_argument("--n-boot", type=int, default=2000)
    add_record_argument(parser)
    args = parser.parse_args()
    from outcome_flywheel.daily_rl.worlds.news import news_direction

    checkpoints = [c.strip() for c in args.checkpoints.split(",") if c.strip()]
    if not checkpoints:
        parser.error("--checkpoints: give base or at least one checkpoint folder")
    for c in checkpoints:
        if c != "base" and not (Path(c) / "adapter_config.json").is_file():
            parser.error(f"--checkpoints {c}: not a LoRA checkpoint folder (no adapter_config.json), nor base")
    started = time.perf_counter()
    model_dir, days, heads = held_out_set(parser, args)
    news = np.array([news_direction(t, s) for t, s in zip(heads["title"], heads["summary"])])
    margins = {c: side_margins(model_dir, c, heads, args.note_format) for c in checkpoints}
    first = checkpoints[0]
    rows = {
        c: {
            **lean_table(m, news),
            **({} if c == first else {"gap_change": gap_change(margins[first], m, news, args.n_boot)}),
        }
        for c, m in margins.items()
    }
    result = dict(
        model=args.model,
        note_format=args.note_format,
        opening=OPENING,
        held_out_days=days,
        headlines=len(heads),
        checkpoints=rows,
        seconds=round(time.perf_counter() - started, 1),
    )
    finish("side_margin", result, args.record)


if __name__ == "__main__":
    main()
