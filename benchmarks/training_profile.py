"""Where one GSPO minibatch's time goes, taken whole and in the memory budget's micro-batches
(`models/train/memory.py`), on the qwen3-0.6b shape (random weights, bf16, CUDA): issue 30 asks the
budget to cost at most 1.3x the whole minibatch's time, and the H200 measured 1.45x (LoRA) and
2.8x (full fine-tuning) without saying why. The last line is one JSON object.

    FLYWHEEL_TRAIN_MEMORY_GIB=14 python -m benchmarks.training_profile    # CUDA: 2 prompts x 8 x 512 tokens
    python -m benchmarks.training_profile --smoke                         # qwen3-tiny (what the CPU runs)

Per trainer (GSPO LoRA, GSPO full fine-tune over fp32 master weights) and per plan (whole: no
budget; parts: the setting, 14 GiB unless `FLYWHEEL_TRAIN_MEMORY_GIB` says otherwise): a warm-up
run, then a timed run under `torch.profiler` on a fresh backend: its seconds, micro-batches and peak,
and the kernels and CPU ops that took the most time. Responses are random ids of the full length
(no sampling: the load, not the text, sets the time).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.gpu import _peak_gib, _peak_reset, _sync, headline_prompts, load_arguments, run_header
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.memory import MEMORY_VARIABLE

DEFAULT_SETTING_GIB = "14"  # about what the default budget gives on a 24 GB card


def gspo_examples(backend, prompts, rollouts: int, new_tokens: int):
    from outcome_flywheel.models.train.gspo_config import GSPOExample

    rng = np.random.default_rng(0)
    vocab = backend.vocab_size
    return [
        GSPOExample(p, rng.integers(10, vocab - 10, new_tokens).tolist(), [-3.0] * new_tokens, float(rng.normal()))
        for p in prompts
        for _ in range(rollouts)
    ]


def timed_run(model_dir, device, examples, lora: bool, setting: str | None, profile: bool) -> dict:
    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.train.gspo_config import GSPOConfig

    if setting is None:
        os.environ.pop(MEMORY_VARIABLE, None)
    else:
        os.environ[MEMORY_VARIABLE] = setting
    backend = TorchBackend(model_dir, device=str(device))
    config = GSPOConfig(
        lora=GSPOConfig().lora if lora else None,
        batch_size=len(examples),
        epochs=1,
        temperature=0.8,
        learning_rate=1e-4 if lora else 1e-5,
    )
    backend.framework.seed(0)
    _peak_reset(device)
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    )
    prof = torch.profiler.profile(activities=activities) if profile else None
    _sync(device)
    started = time.perf_counter()
    if prof is not None:
        with prof:
            stats = train_gspo(backend, examples, config)
            _sync(device)
    else:
        stats = train_gspo(backend, examples, config)
        _sync(device)
    out = {
        "seconds": round(time.perf_counter() - started, 3),
        "micro_batches": stats.extra.get("micro_batches"),
        "token_limit": stats.extra.get("token_limit"),
        "peak_gib": _peak_gib(device),
    }
    if prof is not None:
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        out["top_kernels"] = prof.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=70)
        out["top_cpu_ops"] = prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=70
        )
    del backend
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    load_arguments(parser, headlines=2)
    parser.add_argument("--skip", default="", help="comma list: lora,full")
    args = parser.parse_args(argv)

    from outcome_flywheel.models.provision.qwen3_shapes import benchmark_model
    from outcome_flywheel.models.torch.backend import TorchBackend

    cuda = torch.cuda.is_available()
    smoke = args.smoke or not cuda
    setting = os.environ.get(MEMORY_VARIABLE) or DEFAULT_SETTING_GIB
    if smoke:
        args.shape, args.headlines, args.rollouts, args.prompt_tokens, args.new_tokens = "qwen3-tiny", 2, 4, 40, 32
        setting = os.environ.get(MEMORY_VARIABLE) or "1e-6"  # every sequence alone: the parts path runs
        print(
            "SMOKE RUN: qwen3-tiny, 2 x 4 x 32 tokens. It checks the code paths; its figures say nothing about a GPU."
        )
    device = torch.device("cuda" if cuda else "cpu")
    skip = set(filter(None, args.skip.split(",")))
    result: dict = {
        **run_header("training_profile", smoke, args.shape),
        "rows": args.headlines * args.rollouts,
        "new_tokens": args.new_tokens,
        "setting_gib": setting,
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = benchmark_model(Path(tmp) / args.shape, args.shape)
        probe = TorchBackend(model_dir, device=str(device))
        prompts = headline_prompts(probe, args.headlines, args.prompt_tokens)
        examples = gspo_examples(probe, prompts, args.rollouts, args.new_tokens)
        del probe
        for trainer in ("lora", "full"):
            if trainer in skip:
                continue
            for plan, memory in (("whole", None), ("parts", setting)):
                timed_run(model_dir, device, examples, trainer == "lora", memory, profile=False)  # warm-up
                run = timed_run(model_dir, device, examples, trainer == "lora", memory, profile=True)
                print(
                    f"== GSPO {trainer}, {plan}: {run['seconds']} s, {run['micro_batches']} micro-batches, "
                    f"peak {run['peak_gib']} GiB"
                )
                print(run.pop("top_kernels"))
                print(run.pop("top_cpu_ops"))
                result[f"{trainer}_{plan}"] = run
            whole, parts = result[f"{trainer}_whole"]["seconds"], result[f"{trainer}_parts"]["seconds"]
            result[f"{trainer}_parts_over_whole"] = round(parts / whole, 2)
    os.environ.pop(MEMORY_VARIABLE, None)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
