"""What calls the base tiny-local makes before any training: on the headline's company, and which side.

    python -m benchmarks.tiny_local_calls [--samples 4] [--headlines 0] [--model-dir DIR]

Samples the base model (no adapter) on every distinct headline of the bundled feed archive, as the
daily loop samples its rollouts (`ROLLOUT_SAMPLING`, tiny-local's 160-token cap, one seed per
headline), parses each note's call (`notes.calls.parse_call`) and reports, beside the same figures for the
training corpus itself (`sample_data/tiny_local/notes.jsonl`):

- the share of notes that make a call (long or short) on a company the headline is about
  (`notes.relevance.headline_symbols`), with its exact 95% interval;
- among those calls, the share that are long on good news and on bad news (`worlds.news.news_direction`);
  a base model with no edge is near 0.5 on both.

Notes of one headline share its prompt, so the intervals (which treat notes as independent) are
somewhat narrow. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
from scipy import stats

from benchmarks._results import add_record_argument, finish
from outcome_flywheel.daily_rl.notes.calls import parse_call
from outcome_flywheel.daily_rl.notes.relevance import KNOWN_SYMBOLS, headline_symbols
from outcome_flywheel.daily_rl.worlds.news import news_direction
from outcome_flywheel.settings import PROJECT_ROOT

ARCHIVE = PROJECT_ROOT / "sample_data" / "feeds_archive"


def _share(k: int, n: int) -> dict:
    if n == 0:
        return {"share": None, "k": 0, "n": 0, "ci95": None}
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return {"share": round(k / n, 3), "k": k, "n": n, "ci95": [round(ci.low, 3), round(ci.high, 3)]}


def call_stats(notes: pd.DataFrame) -> dict:
    """Figures over a frame of notes with the headline's `title`, `summary` and the `note` text:
    `on_company` (share of all notes that call long or short on the headline's company), and the long
    share of those calls on good news (`long_on_good`) and on bad news (`long_on_bad`)."""
    on, long_good, long_bad = 0, [0, 0], [0, 0]
    for title, summary, note in zip(notes["title"], notes["summary"], notes["note"]):
        call = parse_call(note, KNOWN_SYMBOLS)
        if call.parse_status != "ok" or call.symbol not in headline_symbols(title, summary):
            continue
        on += 1
        tally = {1: long_good, -1: long_bad}.get(news_direction(title, summary))
        if tally is not None:
            tally[0] += call.side == "long"
            tally[1] += 1
    return {
        "notes": len(notes),
        "on_company": _share(on, len(notes)),
        "long_on_good": _share(*long_good),
        "long_on_bad": _share(*long_bad),
    }


def archive_headlines(archive: Path = ARCHIVE, tz: str = "America/New_York") -> pd.DataFrame:
    """Every distinct headline (by title) of the archive: the rows the daily loop would read, all days."""
    from outcome_flywheel.daily_rl.feeds.headlines import build_headlines
    from outcome_flywheel.daily_rl.feeds.source import FeedSource

    source = FeedSource(archive_dir=str(archive))
    frames = []
    for day in sorted(p.name for p in archive.iterdir() if p.is_dir()):
        kept, _, _ = build_headlines(source.fetch(day), day, tz, max_headlines=10**9)
        frames.append(kept)
    rows = pd.concat(frames, ignore_index=True)
    return rows.drop_duplicates("title").reset_index(drop=True)


def sample_notes(model_dir: Path, headlines: pd.DataFrame, samples: int, seed: int = 0) -> pd.DataFrame:
    """`samples` notes per headline from the model in `model_dir`, sampled as the daily loop's rollouts."""
    from outcome_flywheel.daily_rl.day_settings import TINY_LOCAL_MAX_NEW_TOKENS
    from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_SAMPLING, generation_seed
    from outcome_flywheel.models.loader import load_backend
    from outcome_flywheel.models.prompts import trading_note_messages

    policy = load_backend("torch", model_dir, device="cpu")
    prompts = [trading_note_messages(t, s) for t, s in zip(headlines["title"], headlines["summary"])]
    seeds = [generation_seed(seed, d, h) for d, h in zip(headlines["date"], headlines["headline_id"])]
    config = replace(ROLLOUT_SAMPLING, max_new_tokens=TINY_LOCAL_MAX_NEW_TOKENS)
    groups = policy.sample(prompts, samples, config, seeds)
    rows = [
        dict(title=t, summary=s, note=x.text)
        for t, s, group in zip(headlines["title"], headlines["summary"], groups)
        for x in group
    ]
    return pd.DataFrame(rows, columns=["title", "summary", "note"])


def _line(name: str, figures: dict) -> str:
    def fmt(s: dict) -> str:
        return (
            "n/a" if s["n"] == 0 else f"{s['share']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}] ({s['k']}/{s['n']})"
        )

    return (
        f"{name:<8} notes {figures['notes']:>5}  on the headline's company {fmt(figures['on_company'])}  "
        f"long on good news {fmt(figures['long_on_good'])}  long on bad news {fmt(figures['long_on_bad'])}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4, help="notes per headline")
    parser.add_argument("--headlines", type=int, default=0, help="use the first N distinct headlines (0: all)")
    parser.add_argument("--model-dir", default=None, help="a tiny-local folder (default: the cached build)")
    add_record_argument(parser)
    args = parser.parse_args()

    from outcome_flywheel.models.provision.tiny_local import cached_tiny_local, load_corpus, read_build_info

    model_dir = Path(args.model_dir) if args.model_dir else cached_tiny_local()
    headlines = archive_headlines()
    if args.headlines:
        headlines = headlines.head(args.headlines)
    corpus = call_stats(pd.DataFrame(load_corpus()))
    started = time.perf_counter()
    base = call_stats(sample_notes(model_dir, headlines, args.samples))
    seconds = round(time.perf_counter() - started, 1)
    print(
        f"tiny-local {read_build_info(model_dir)['fingerprint']}: {len(headlines)} archive headlines x {args.samples} notes "
        f"({seconds} s, {platform.machine()})"
    )
    print(_line("corpus", corpus))
    print(_line("base", base))
    result = dict(
        model_dir=str(model_dir),
        headlines=len(headlines),
        samples=args.samples,
        seconds=seconds,
        corpus=corpus,
        base=base,
    )
    finish("tiny_local_calls", result, args.record)


if __name__ == "__main__":
    main()
