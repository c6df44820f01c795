"""Data-parallel training and rollout sampling, 1 process against N (torchrun, gloo on CPU / NCCL on
CUDA): the wall time of GSPO, weighted DPO and SFT on tiny-local (or --model), the same data and
minibatches in each, and the final losses (which agree within fp32 rounding,
tests/models/train/test_data_parallel.py); then the day's rollout sampling (`shards.sample_across_ranks`:
--headlines prompts x 4 notes of 64 tokens, each rank its share) and whether the notes' tokens are the same.

    python -m benchmarks.data_parallel [--processes 2] [--examples 48] [--headlines 16] [--model PATH] [--device cpu]

Each configuration runs in its own `torchrun --standalone` (so both pay the same start-up); a trainer's
time is its call alone (the model loaded, the process group up). Prints one JSON object on its last line.
On a CPU, N processes share the machine's cores: set OMP_NUM_THREADS per process (torchrun's default 1).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks._results import add_record_argument, finish
from outcome_flywheel.steps.launch import StepLaunch

TRAINERS = ("gspo", "dpo", "sft")


def data(backend, n: int):
    """GSPO rollouts (groups of 4 on a prompt), DPO pairs and SFT examples, fixed."""
    from outcome_flywheel.models.train.dpo_config import PreferencePair, WeightedDPOConfig
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample
    from outcome_flywheel.models.train.sft_config import SFTConfig, SFTExample

    prompts = [
        [{"role": "user", "content": f"Headline {i}: shares of company {i} moved today. Write a note."}]
        for i in range(max(1, n // 4))
    ]
    texts = [
        f"Call: {'Buy' if i % 2 else 'Sell'} company {i % 7}. Reason: the move" + " and more" * (i % 5)
        for i in range(n)
    ]
    responses = [backend.encode_response(t) for t in texts]
    gspo_prompts = [prompts[i // 4 % len(prompts)] for i in range(n)]
    behaviour = backend.response_logprobs(gspo_prompts, responses)
    gspo = [
        GSPOExample(p, r, [float(x) for x in b], (-1.0) ** i * (0.2 + i % 3), token_advantages=[0.1] * len(r))
        for i, (p, r, b) in enumerate(zip(gspo_prompts, responses, behaviour))
    ]
    pairs = [PreferencePair(prompts[i % len(prompts)], texts[i], texts[(i + 1) % n], 0.5 + i % 3) for i in range(n)]
    sft = [SFTExample(prompts[i % len(prompts)], texts[i]) for i in range(n)]
    return {
        "gspo": (gspo, GSPOConfig(batch_size=16, epochs=1)),
        "dpo": (pairs, WeightedDPOConfig(batch_size=16, epochs=1)),
        "sft": (sft, SFTConfig(batch_size=16, epochs=1)),
    }


SAMPLES_PER_HEADLINE, SAMPLED_TOKENS = 4, 64


def sample(backend, headlines: int) -> tuple[float, list]:
    """The rollout sampling of `headlines` prompts on this process's share: (seconds, every note's tokens)."""
    import torch

    from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_SAMPLING
    from outcome_flywheel.models.train.shards import sample_across_ranks

    prompts = [
        [{"role": "user", "content": f"Headline {i}: company {i} " + "reported results " * (1 + i % 4)}]
        for i in range(headlines)
    ]
    config = replace(ROLLOUT_SAMPLING, max_new_tokens=SAMPLED_TOKENS, ignore_eos=True)  # a fixed load
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    started = time.perf_counter()
    groups = sample_across_ranks(backend, prompts, SAMPLES_PER_HEADLINE, config, [1000 + i for i in range(headlines)])
    return time.perf_counter() - started, [[list(s.token_ids) for s in g] for g in groups]


def worker(model: str, device: str, n: int, headlines: int, out: Path) -> None:
    """torchrun's entry: each trainer on a fresh backend, timed; rank 0 writes the figures."""
    import torch

    from outcome_flywheel.models.loader import load_backend
    from outcome_flywheel.models.torch import training as dp
    from outcome_flywheel.models.train.dpo import train_weighted_dpo
    from outcome_flywheel.models.train.gspo import train_gspo
    from outcome_flywheel.models.train.sft import train_sft

    rank, world = dp.init_from_env(device)
    train = {"gspo": train_gspo, "dpo": train_weighted_dpo, "sft": train_sft}
    figures = {}
    for name in TRAINERS:
        backend = load_backend("torch", model, device=device)
        items, config = data(backend, n)[name]
        backend.framework.seed(1)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        started = time.perf_counter()
        stats = train[name](backend, items, config)
        figures[name] = {
            "train_s": round(time.perf_counter() - started, 3),
            "steps": stats.steps,
            "losses": [round(x, 6) for x in stats.losses],
        }
    seconds, notes = sample(load_backend("torch", model, device=device), headlines)
    figures["sample"] = {
        "sample_s": round(seconds, 3),
        "tokens": sum(len(t) for g in notes for t in g),
        "notes_sha256": hashlib.sha256(json.dumps(notes).encode()).hexdigest()[:16],
    }
    if rank == 0:
        out.write_text(json.dumps({"processes": world, **figures}))


def run(processes: int, model: str, device: str, n: int, headlines: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        command = StepLaunch(launcher="torchrun", processes=processes, python=sys.executable).module_command(
            "benchmarks.data_parallel",
            *("--worker", str(out), "--model", model, "--device", device),
            *("--examples", str(n), "--headlines", str(headlines)),
        )
        started = time.perf_counter()
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
        )
        if done.returncode != 0:
            raise SystemExit(f"{processes} process(es) failed:\n{done.stderr[-3000:]}")
        figures = json.loads(out.read_text())
        figures["wall_s"] = round(time.perf_counter() - started, 3)
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--examples", type=int, default=48)
    parser.add_argument("--headlines", type=int, default=16, help="prompts of the sampling part (4 notes each)")
    parser.add_argument("--model", default=None, help="a model folder (default: tiny-local, built if needed)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    add_record_argument(parser)
    args = parser.parse_args()
    if args.model is None:
        from outcome_flywheel.models.provision.tiny_local import cached_tiny_local

        args.model = str(cached_tiny_local())
    if args.worker:
        worker(args.model, args.device, args.examples, args.headlines, Path(args.worker))
        return
    one = run(1, args.model, args.device, args.examples, args.headlines)
    many = run(args.processes, args.model, args.device, args.examples, args.headlines)
    result = {
        "benchmark": "data_parallel",
        "model": Path(args.model).name,
        "device": args.device,
        "examples": args.examples,
        "omp_threads_per_process": int(os.environ.get("OMP_NUM_THREADS", "1")),
        "cpus": os.cpu_count(),
        "one": one,
        "many": many,
        "speedup": {t: round(one[t]["train_s"] / max(many[t]["train_s"], 1e-9), 3) for t in TRAINERS},
        "max_loss_gap": max(abs(a - b) for t in TRAINERS for a, b in zip(one[t]["losses"], many[t]["losses"])),
        "sample_speedup": round(one["sample"]["sample_s"] / max(many["sample"]["sample_s"], 1e-9), 3),
        "same_notes": one["sample"]["notes_sha256"] == many["sample"]["notes_sha256"],
    }
    finish("data_parallel", result, args.record)


if __name__ == "__main__":
    main()
