"""Generation benchmark: the same prompts and sample count, one sample at a time vs batched.

    python -m benchmarks.generation [--prompts 30] [--samples 8] [--max-new-tokens 64] [--shape qwen3-0.6b]

The default is one daily partition's load: 30 headlines x 8 notes. Batching gains more the
more rows share a step, so fewer prompts give a smaller ratio (`--record` keeps each run: docs/benchmarks.md).

Uses the project's base model (tiny-local is built into $FLYWHEEL_DATA_DIR/models/tiny-local
first if missing). Prints wall time and tokens/s of each way and their ratio; the last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks._results import add_record_argument, finish
from outcome_flywheel.models.interface import SamplingConfig
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.provision.qwen3_shapes import SHAPES, benchmark_model
from outcome_flywheel.models.provision.tiny_local import TinyLocalConfig, ensure_tiny_local

HEADLINES = [
    (
        "Nvidia beats quarterly estimates on strong data center demand",
        "Revenue rose 12% as data center sales beat forecasts.",
    ),
    ("Exxon Mobil cuts outlook, shares slide after hours", "The company blamed weaker energy orders."),
    ("Apple announces $40 billion share buyback", "The board approved a larger repurchase program."),
    ("Boeing faces antitrust probe over defense practices", "Officials opened a formal investigation."),
    ("Eli Lilly wins multi-year pharma contract", "The contract is worth about $9 billion over five years."),
    ("Netflix misses estimates as advertising sales slow", "Revenue fell 4% short of forecasts."),
    ("JPMorgan raises full-year guidance", "Management lifted its outlook citing payments momentum."),
    ("Intel chief financial officer steps down", "The exit comes ahead of a key data center launch."),
]


def base_model_path(resource: ModelLoader) -> Path:
    """The base model folder, building tiny-local or downloading a hub model first if needed."""
    if resource.is_tiny_local:
        ensure_tiny_local(resource.tiny_local_dir(), TinyLocalConfig(seed=resource.seed))
        return resource.tiny_local_dir()
    return resource.base_model_dir(download=True)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        help="a random-weight model of this shape instead of FLYWHEEL_BASE_MODEL "
        "(qwen3-0.6b: Qwen3-0.6B's exact configuration, bf16 on CUDA); for speed figures only",
    )
    add_record_argument(parser)
    args = parser.parse_args()

    resource = ModelLoader.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        if args.shape:
            resource = replace(resource, base_model=f"random {args.shape}")
            backend = resource.load(model_path=benchmark_model(Path(tmp) / args.shape, args.shape))
        else:
            backend = resource.load(model_path=base_model_path(resource))
        return run(backend, resource, args)


def run(backend, resource: ModelLoader, args) -> dict:
    # Distinct prompts (the headline number makes each one its own), as a day's headlines are.
    prompts = [
        trading_note_messages(f"{HEADLINES[i % len(HEADLINES)][0]} ({i + 1})", HEADLINES[i % len(HEADLINES)][1])
        for i in range(args.prompts)
    ]
    seeds = list(range(args.prompts))
    # min_new_tokens is not a knob here: both ways stop at end-of-turn, so compare tokens/s.
    cfg = SamplingConfig(max_new_tokens=args.max_new_tokens, prompts_per_batch=args.prompts)
    backend.sample(prompts[:1], 1, cfg, seeds[:1])  # warm-up

    started = time.perf_counter()
    sequential_tokens = 0
    for i, prompt in enumerate(prompts):
        for j in range(args.samples):
            # One sample per call, seeded per (prompt, sample): the original loop's way.
            [[s]] = backend.sample([prompt], 1, cfg, [seeds[i] * 1000 + j])
            sequential_tokens += len(s.token_ids)
    sequential_s = time.perf_counter() - started

    started = time.perf_counter()
    groups = backend.sample(prompts, args.samples, cfg, seeds)
    batched_s = time.perf_counter() - started
    batched_tokens = sum(len(s.token_ids) for g in groups for s in g)

    seq_tps = sequential_tokens / sequential_s
    bat_tps = batched_tokens / batched_s
    result = {
        "benchmark": "generation",
        "model": resource.base_model,
        "backend": resource.backend,
        "device": str(getattr(backend, "device", "cpu")),
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads",
        "prompts": args.prompts,
        "samples_per_prompt": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "sequential_s": round(sequential_s, 3),
        "sequential_tokens": sequential_tokens,
        "sequential_tokens_per_s": round(seq_tps, 1),
        "batched_s": round(batched_s, 3),
        "batched_tokens": batched_tokens,
        "batched_tokens_per_s": round(bat_tps, 1),
        "speedup_wall": round(sequential_s / batched_s, 2),
        "speedup_tokens_per_s": round(bat_tps / seq_tps, 2),
    }
    print(f"one at a time: {sequential_s:.2f} s, {sequential_tokens} tokens, {seq_tps:.0f} tokens/s")
    print(f"batched:       {batched_s:.2f} s, {batched_tokens} tokens, {bat_tps:.0f} tokens/s")
    print(f"speed-up: {result['speedup_tokens_per_s']}x tokens/s, {result['speedup_wall']}x wall time")
    return finish("generation", result, args.record)


if __name__ == "__main__":
    main()
