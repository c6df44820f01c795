"""Backends benchmark: per-stage wall times, torch vs mlx, on the same machine, model and data.

    python -m benchmarks.backends [--prompts 8] [--samples 8] [--max-new-tokens 64]
                                  [--backends torch,mlx] [--openblas /path/libopenblas.so.0]

Stages, each timed on a freshly loaded policy (load time excluded, one warm-up call first):
  sampling  `--samples` notes per headline prompt, batched (`SamplingConfig` defaults otherwise)
  judge     greedy single-letter answers to one judge prompt per headline
            (`prompts.judge_messages`: the headline, the next headlines, its 8 notes as A..H)
  gspo      one epoch of `train_gspo` over the rollouts (LoRA r=8 on all projections)
  dpo       one epoch of `train_weighted_dpo` over pairs built from the same rollouts
The data (rollouts, their behaviour log-probs, rewards, pairs) are made once, by torch with
fixed seeds, and fed to every backend. With `--openblas`, mlx runs a second time in a
subprocess with that OpenBLAS preloaded ("mlx+openblas"): the Linux `mlx[cpu]` wheel links
the reference BLAS, and this shows what that costs. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._results import add_record_argument, finish
from benchmarks.generation import HEADLINES, base_model_path
from outcome_flywheel.models.interface import LoraSettings, SamplingConfig
from outcome_flywheel.models.loader import ModelLoader, load_backend
from outcome_flywheel.models.prompts import judge_messages, trading_note_messages
from outcome_flywheel.models.train.dpo import train_weighted_dpo
from outcome_flywheel.models.train.gspo import train_gspo

STAGES = ("sampling", "judge", "gspo", "dpo")


def make_data(path: Path, args) -> dict:
    """Rollouts, judge prompts, GSPO examples and DPO pairs, made once by torch with fixed seeds."""
    policy = load_backend("torch", path, device="cpu")  # CPU fp32: the same data on every machine
    headlines = [HEADLINES[i % len(HEADLINES)] for i in range(args.prompts)]
    prompts = [trading_note_messages(t, s) for t, s in headlines]
    cfg = SamplingConfig(max_new_tokens=args.max_new_tokens, prompts_per_batch=args.prompts)
    groups = policy.sample(prompts, args.samples, cfg, seeds=list(range(args.prompts)))
    rng = np.random.default_rng(0)
    examples, pairs, judge_prompts = [], [], []
    for i, (prompt, group) in enumerate(zip(prompts, groups)):
        rewards = rng.uniform(size=len(group))
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        for s, a in zip(group, adv):
            if s.token_ids:
                examples.append(
                    {
                        "prompt": prompt,
                        "response_ids": s.token_ids,
                        "behavior_logprobs": s.logprobs,
                        "advantage": float(a),
                    }
                )
        ranked = [group[k].text for k in np.argsort(-rewards)]
        for k in range(0, len(ranked) - 1, 2):  # best vs next, third vs fourth, ...
            pairs.append(
                {
                    "prompt": prompt,
                    "chosen": ranked[k],
                    "rejected": ranked[k + 1],
                    "weight": float(rng.choice([1.0, 3.0, 0.3, 1.5])),
                }
            )
        nxt = [h[0] for h in headlines[i + 1 : i + 4]] or [headlines[0][0]]
        judge_prompts.append(judge_messages(headlines[i][0], nxt, [s.text for s in group][:8]))
    return {"prompts": prompts, "judge_prompts": judge_prompts, "examples": examples, "pairs": pairs}


def time_backend(name: str, path: Path, data: dict, args) -> dict:
    """Per-stage seconds of one backend ('torch' or 'mlx') on `data`."""
    from outcome_flywheel.models.train.dpo_config import PreferencePair, WeightedDPOConfig
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

    device = args.torch_device if name == "torch" else "auto"
    lora = LoraSettings(r=8, alpha=16)
    out: dict = {}
    prompts = data["prompts"]
    cfg = SamplingConfig(max_new_tokens=args.max_new_tokens, prompts_per_batch=len(prompts))

    policy = load_backend(name, path, device=device)
    policy.sample(prompts[:1], 1, SamplingConfig(max_new_tokens=4), [0])  # warm-up
    started = time.perf_counter()
    groups = policy.sample(prompts, args.samples, cfg, seeds=list(range(len(prompts))))
    out["sampling"] = time.perf_counter() - started
    out["sampling_tokens"] = sum(len(s.token_ids) for g in groups for s in g)

    started = time.perf_counter()
    answers = policy.greedy(data["judge_prompts"], max_new_tokens=1)
    out["judge"] = time.perf_counter() - started
    out["judge_prompt_tokens"] = sum(len(policy.prompt_ids(p)) for p in data["judge_prompts"])
    out["judge_answers"] = answers

    policy = load_backend(name, path, device=device)
    examples = [GSPOExample(**e) for e in data["examples"]]
    config = GSPOConfig(batch_size=16, epochs=1, lora=lora, temperature=cfg.temperature)
    stats = train_gspo(policy, examples, config)
    out["gspo"] = stats.wall_s
    out["gspo_steps"] = stats.steps
    out["gspo_first_loss"] = stats.losses[0]

    policy = load_backend(name, path, device=device)
    pairs = [PreferencePair(**p) for p in data["pairs"]]
    dpo_config = WeightedDPOConfig(batch_size=8, epochs=1, lora=lora, learning_rate=2e-3)
    started = time.perf_counter()  # includes the reference pass over all pairs
    stats = train_weighted_dpo(policy, pairs, dpo_config)
    out["dpo"] = time.perf_counter() - started
    out["dpo_steps"] = stats.steps
    out["dpo_first_loss"] = stats.losses[0]
    return out


def _subprocess_mlx(path: Path, data: dict, args, openblas: str) -> dict:
    """The mlx half again in a child process with OpenBLAS preloaded (it must be set at start)."""
    with tempfile.TemporaryDirectory() as tmp:
        data_file, out_file = Path(tmp) / "data.json", Path(tmp) / "out.json"
        data_file.write_text(json.dumps(data))
        env = dict(os.environ, LD_PRELOAD=openblas)
        if args.openblas_libs:
            env["LD_LIBRARY_PATH"] = args.openblas_libs + os.pathsep + env.get("LD_LIBRARY_PATH", "")
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.backends",
            "--child",
            str(data_file),
            str(out_file),
            str(path),
            "--samples",
            str(args.samples),
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--torch-device",
            args.torch_device,
        ]
        subprocess.run(cmd, env=env, check=True)
        return json.loads(out_file.read_text())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--backends", default="torch,mlx")
    parser.add_argument("--torch-device", default="auto", help="torch device (auto: cuda, then mps, then cpu)")
    parser.add_argument(
        "--openblas",
        default=os.environ.get("FLYWHEEL_MLX_OPENBLAS"),
        help="libopenblas.so to preload for an extra mlx run",
    )
    parser.add_argument(
        "--openblas-libs", default=None, help="extra LD_LIBRARY_PATH for that run (e.g. where libgfortran.so.5 is)"
    )
    parser.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    add_record_argument(parser)
    args = parser.parse_args(argv)

    if args.child:  # the preloaded-OpenBLAS mlx run
        data_file, out_file, path = args.child
        result = time_backend("mlx", Path(path), json.loads(Path(data_file).read_text()), args)
        Path(out_file).write_text(json.dumps(result))
        return result

    resource = ModelLoader.from_env()
    path = base_model_path(resource)
    data = make_data(path, args)
    results: dict[str, dict] = {}
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        print(f"timing {name} ...", flush=True)
        results[name] = time_backend(name, path, data, args)
    if args.openblas and "mlx" in results:
        print("timing mlx+openblas ...", flush=True)
        results["mlx+openblas"] = _subprocess_mlx(path, data, args, args.openblas)

    names = list(results)
    print(
        f"\nmodel {resource.base_model}, {len(data['prompts'])} prompts x {args.samples} samples, "
        f"max_new_tokens {args.max_new_tokens}, {len(data['examples'])} GSPO examples, {len(data['pairs'])} DPO pairs, "
        f"{platform.machine()} {os.cpu_count()} cores"
    )
    print(
        f"{'stage':<10}"
        + "".join(f"{n:>16}" for n in names)
        + ("   mlx/torch" if {"torch", "mlx"} <= set(names) else "")
    )
    for stage in STAGES:
        row = f"{stage:<10}" + "".join(f"{results[n][stage]:>15.2f}s" for n in names)
        if {"torch", "mlx"} <= set(names):
            row += f"   {results['mlx'][stage] / results['torch'][stage]:>9.2f}x"
        print(row)
    if {"torch", "mlx"} <= set(names):
        agree = sum(a == b for a, b in zip(results["torch"]["judge_answers"], results["mlx"]["judge_answers"]))
        print(
            f"judge answers identical in {agree}/{len(data['judge_prompts'])} prompts; "
            f"first GSPO loss torch {results['torch']['gspo_first_loss']:.6f} mlx {results['mlx']['gspo_first_loss']:.6f}"
        )
    summary = {
        "benchmark": "backends",
        "model": resource.base_model,
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "prompts": len(data["prompts"]),
        "samples_per_prompt": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "gspo_examples": len(data["examples"]),
        "dpo_pairs": len(data["pairs"]),
        "seconds": {n: {s: round(results[n][s], 3) for s in STAGES} for n in names},
        "sampling_tokens": {n: results[n]["sampling_tokens"] for n in names},
    }
    if {"torch", "mlx"} <= set(names):
        summary["mlx_over_torch"] = {s: round(results["mlx"][s] / results["torch"][s], 2) for s in STAGES}
    return finish("backends", summary, args.record, argv)


if __name__ == "__main__":
    main()
