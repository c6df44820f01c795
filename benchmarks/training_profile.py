"""Where one GSPO or DPO minibatch's time goes, taken whole, in the memory budget's micro-batches
(`models/train/memory.py`) and with the layers recomputed (`torch/recompute.py`), on the qwen3-0.6b
shape (random weights, bf16, CUDA): issue 30 asks the budget to cost at most 1.3x the whole
minibatch's time, and the H200 measured 1.45x (LoRA) and 2.8x (full fine-tuning) in parts. The last
line is one JSON object.

    FLYWHEEL_TRAIN_MEMORY_GIB=14 python -m benchmarks.training_profile    # CUDA: 2 prompts x 8 x 512 tokens
    python -m benchmarks.training_profile --memory OUT/                   # CUDA: what is alive at the peak
    python -m benchmarks.training_profile --smoke                         # qwen3-tiny (what the CPU runs)

Per trainer (GSPO LoRA, GSPO full fine-tune over fp32 master weights, weighted DPO over a LoRA
adapter on pairs of the same responses) and per plan (whole: no budget; parts: the setting, 14 GiB
unless `FLYWHEEL_TRAIN_MEMORY_GIB` says otherwise, every activation kept; recompute: the same
setting, the layers recomputed): a warm-up run, then a timed run under `torch.profiler` on a fresh
backend: its seconds, micro-batches and peak, the host's and the device's own time and the kernel
launches (on an H200, 2 parts of a LoRA GSPO step took 47 % more host time than the whole and 7 %
more kernel time), and the ops that took the most time. Responses are random ids of the full length
(no sampling: the load, not the text, sets the time).

`--memory DIR` (CUDA) asks instead where a budgeted step's peak goes, beyond what `memory.py` counts:
the parts plan runs under CUDA's allocator history (`torch.cuda.memory._record_memory_history`,
Python stacks), the history is replayed to the moment of the peak, and the blocks alive then are
summed by the first frame of this project, transformers or PEFT that allocated them (the backward
pass allocates on autograd's thread, which has no Python frame). The snapshot goes to DIR, gzipped,
for `python -m torch.cuda._memory_viz`.
"""

from __future__ import annotations

import argparse
import gzip
import os
import pickle
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from benchmarks._results import add_record_argument, finish
from benchmarks.gpu import _peak_gib, _peak_reset, _sync, folded_text, headline_prompts, load_arguments, run_header
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.memory import MEMORY_VARIABLE, RECOMPUTE_VARIABLE

DEFAULT_SETTING_GIB = "14"  # about what the default budget gives on a 24 GB card
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel")  # the runtime's and the driver's
# ops that wait for the device to catch up: a value read on the host (`.item()`, `float()`) and boolean
# indexing, whose result size the host needs; each drains the launch queue the host had built ahead
HOST_WAITS = ("aten::_local_scalar_dense", "aten::nonzero")
FRAME_MARKERS = ("/outcome_flywheel/", "/transformers/", "/peft/")
NO_FRAME = "(no Python frame: autograd's backward thread, or C++)"
# (name, under the setting, FLYWHEEL_TRAIN_RECOMPUTE): the minibatch whole without a budget; in the
# setting's micro-batches, every activation kept; whole (or in fewer parts) with the layers recomputed
PLANS = (("whole", False, "never"), ("parts", True, "never"), ("recompute", True, "always"))
# GSPO over a LoRA adapter and as a full fine-tune over float32 master weights; weighted DPO (LoRA) over
# pairs of the same responses
TRAINERS = {"lora": "GSPO LoRA", "full": "GSPO full fine-tune", "dpo": "weighted DPO LoRA"}


def gspo_examples(backend, prompts, rollouts: int, new_tokens: int):
    from outcome_flywheel.models.train.gspo_config import GSPOExample

    rng = np.random.default_rng(0)
    vocab = backend.vocab_size
    return [
        GSPOExample(p, rng.integers(10, vocab - 10, new_tokens).tolist(), [-3.0] * new_tokens, float(rng.normal()))
        for p in prompts
        for _ in range(rollouts)
    ]


def dpo_pairs(backend, examples):
    """Preference pairs over the GSPO examples' prompts, the chosen and rejected their responses as
    text of their length (`benchmarks.gpu.folded_text`, as `benchmarks.gpu` times DPO)."""
    from outcome_flywheel.models.train.dpo_config import PreferencePair

    texts = [folded_text(backend, e.response_ids) for e in examples]
    return [
        PreferencePair(examples[2 * k].prompt, texts[2 * k], texts[2 * k + 1], 1.0) for k in range(len(examples) // 2)
    ]


def fresh_step(model_dir, device, examples, trainer: str, setting: str | None, recompute: str = "never"):
    """A fresh backend under `setting` (None: no budget) and `recompute` (`FLYWHEEL_TRAIN_RECOMPUTE`),
    and one optimiser step of `trainer` (`TRAINERS`) over all of `examples` (DPO: their pairs), the
    peak statistic reset: (backend, a call that runs the step and returns its stats)."""
    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.train.dpo import train_weighted_dpo
    from outcome_flywheel.models.train.dpo_config import WeightedDPOConfig
    from outcome_flywheel.models.train.gspo_config import GSPOConfig

    if setting is None:
        os.environ.pop(MEMORY_VARIABLE, None)
    else:
        os.environ[MEMORY_VARIABLE] = setting
    os.environ[RECOMPUTE_VARIABLE] = recompute
    backend = TorchBackend(model_dir, device=str(device))
    if trainer == "dpo":
        pairs = dpo_pairs(backend, examples)
        config = WeightedDPOConfig(epochs=1, batch_size=len(pairs), completion_unit="sequence")
        step = lambda: train_weighted_dpo(backend, pairs, config)  # noqa: E731
    else:
        lora = trainer == "lora"
        config = GSPOConfig(
            lora=GSPOConfig().lora if lora else None,
            batch_size=len(examples),
            epochs=1,
            temperature=0.8,
            learning_rate=1e-4 if lora else 1e-5,
        )
        step = lambda: train_gspo(backend, examples, config)  # noqa: E731
    backend.framework.seed(0)
    _peak_reset(device)
    return backend, step


def timed_run(
    model_dir, device, examples, trainer: str, setting: str | None, profile: bool, recompute: str = "never"
) -> dict:
    backend, step = fresh_step(model_dir, device, examples, trainer, setting, recompute)
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    )
    prof = torch.profiler.profile(activities=activities) if profile else None
    _sync(device)
    started = time.perf_counter()
    if prof is not None:
        with prof:
            stats = step()
            _sync(device)
    else:
        stats = step()
        _sync(device)
    out = {
        "seconds": round(time.perf_counter() - started, 3),
        # the optimiser steps alone: the rest is the adapter, the prompts' encoding, DPO's reference pass
        "train_loop_s": round(stats.wall_s, 3),
        "micro_batches": stats.extra.get("micro_batches"),
        "token_limit": stats.extra.get("token_limit"),
        "recompute": stats.extra.get("recompute"),
        "peak_gib": _peak_gib(device),
    }
    if prof is not None:
        events = prof.key_averages()
        # a launch-bound step shows as host time growing with the parts while the device's stays
        out["self_cpu_s"] = round(sum(e.self_cpu_time_total for e in events) / 1e6, 3)
        out["self_device_s"] = round(sum(e.self_device_time_total for e in events) / 1e6, 3)
        out["kernel_launches"] = sum(e.count for e in events if e.key in KERNEL_LAUNCHES)
        out["host_waits"] = sum(e.count for e in events if e.key in HOST_WAITS)
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        # one aggregation for every figure: each key_averages() walks every event again (most of a smoke run's time)
        out["top_kernels"] = events.table(sort_by=sort, row_limit=15, max_name_column_width=70)
        out["top_cpu_ops"] = events.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=70)
    del backend
    return out


def live_at_peak(trace: list[dict]) -> tuple[int, dict[str, list[int]]]:
    """Replays an allocator history (oldest first): the most bytes allocated during it beyond what
    was allocated before it began, and the blocks alive at that moment, summed by the frame that
    allocated them ({key: [bytes, blocks]}). A block counts from its alloc to its free_requested,
    as torch.cuda.max_memory_allocated counts it; frees of blocks allocated before the history
    are credited back, so the baseline can fall below zero."""
    live: dict[int, dict] = {}
    now = peak = 0
    peak_live: dict[int, dict] = {}
    for event in trace:
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = event
            now += event["size"]
            if now > peak:
                peak, peak_live = now, dict(live)
        elif action == "free_requested":
            now -= event["size"]
            live.pop(event["addr"], None)
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for event in peak_live.values():
        group = groups[allocation_site(event.get("frames") or [])]
        group[0] += event["size"]
        group[1] += 1
    return peak, dict(groups)


def allocation_site(frames: list[dict]) -> str:
    """The innermost frame of this project, transformers or PEFT ("file:line function"), else the
    innermost frame, else NO_FRAME."""
    for frame in frames:
        filename = frame.get("filename", "")
        if any(marker in filename for marker in FRAME_MARKERS):
            return f"{'/'.join(Path(filename).parts[-2:])}:{frame.get('line')} {frame.get('name')}"
    if frames:
        return f"{Path(frames[0].get('filename', '?')).name}:{frames[0].get('line')} {frames[0].get('name')}"
    return NO_FRAME


def memory_run(model_dir, device, examples, trainer: str, setting: str, out_dir: Path) -> dict:
    """One budgeted GSPO step under the allocator's history (module docstring): the peak beyond the
    loaded model, the count's figures for it, and the blocks alive at the peak by allocation site."""
    from outcome_flywheel.models.train import memory

    backend, step = fresh_step(model_dir, device, examples, trainer, setting)
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=400_000)
    try:
        stats = step()
        _sync(device)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    peak, groups = live_at_peak(trace)
    with gzip.open(out_dir / f"{trainer}_memory_snapshot.pickle.gz", "wb") as handle:
        pickle.dump(snapshot, handle)
    out = {
        "peak_over_start_gib": round((torch.cuda.max_memory_allocated() - before) / 2**30, 3),
        "replayed_peak_gib": round(peak / 2**30, 3),
        "trace_events": len(trace),  # 400,000: the ring buffer wrapped, the replay is partial
        "micro_batches": stats.extra.get("micro_batches"),
        "token_limit": stats.extra.get("token_limit"),
        "budget_gib": round((memory.budget_bytes(backend) or 0) / 2**30, 3),
        "state_gib": round(memory.training_state_bytes(backend) / 2**30, 3),
        "bytes_per_token": memory.bytes_per_token(backend),
        "head_gib": round(memory.head_bytes(backend) / 2**30, 3),
        "at_peak_by_site_mib": {
            site: [round(size / 2**20, 1), blocks]
            for site, (size, blocks) in sorted(groups.items(), key=lambda item: -item[1][0])[:25]
        },
    }
    del backend
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    load_arguments(parser, headlines=2)
    parser.add_argument("--skip", default="", help=f"comma list of {','.join(TRAINERS)}")
    parser.add_argument("--memory", type=Path, help="(CUDA) a folder: where the budgeted step's peak goes, instead")
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="skip each plan's untimed warm-up run (a quicker check of the code paths; the times then include first calls)",
    )
    add_record_argument(parser)
    args = parser.parse_args(argv)

    from outcome_flywheel.models.provision.qwen3_shapes import benchmark_model
    from outcome_flywheel.models.torch.backend import TorchBackend

    cuda = torch.cuda.is_available()
    smoke = args.smoke or not cuda
    setting = os.environ.get(MEMORY_VARIABLE) or DEFAULT_SETTING_GIB
    if smoke:
        # 2 groups of 2, each sequence its own part under the setting: every trainer and plan runs, and the
        # profiler's events (whose aggregation is most of a smoke run's time) stay few
        args.shape, args.headlines, args.rollouts, args.prompt_tokens, args.new_tokens = "qwen3-tiny", 2, 2, 24, 16
        setting = os.environ.get(MEMORY_VARIABLE) or "1e-6"  # every sequence alone: the parts path runs
        print(
            "SMOKE RUN: qwen3-tiny, 2 x 2 x 16 tokens, each trainer profiled in one plan. It checks the code paths;"
            " its figures say nothing about a GPU."
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
        for trainer in TRAINERS:
            if trainer in skip or (trainer == "dpo" and args.memory is not None):
                continue
            if args.memory is not None:
                if not cuda:
                    raise SystemExit("--memory reads CUDA's allocator: it needs a CUDA device")
                args.memory.mkdir(parents=True, exist_ok=True)
                timed_run(model_dir, device, examples, trainer, setting, profile=False)  # warm-up
                run = memory_run(model_dir, device, examples, trainer, setting, args.memory)
                print(f"== {TRAINERS[trainer]}, at the peak by allocation site (MiB, blocks):")
                for site, (mib, blocks) in run["at_peak_by_site_mib"].items():
                    print(f"{mib:10.1f} {blocks:6d}  {site}")
                result[f"{trainer}_memory"] = run
                continue
            for plan, budgeted, recompute in PLANS:
                memory = setting if budgeted else None
                if not args.no_warm_up:
                    timed_run(model_dir, device, examples, trainer, memory, False, recompute)  # warm-up
                # a smoke run profiles one plan a trainer: parsing the profiler's events was half its CPU
                profiled = not smoke or plan == "whole"
                run = timed_run(model_dir, device, examples, trainer, memory, profiled, recompute)
                print(
                    f"== {TRAINERS[trainer]}, {plan}: {run['seconds']} s ({run['train_loop_s']} s of steps), "
                    f"{run['micro_batches']} micro-batches, peak {run['peak_gib']} GiB"
                    + (
                        f"; host {run['self_cpu_s']} s, device {run['self_device_s']} s, "
                        f"{run['kernel_launches']} kernel launches, {run['host_waits']} waits for the device"
                        if profiled
                        else " (not profiled in a smoke run)"
                    )
                )
                if profiled:
                    print(run.pop("top_kernels"))
                    print(run.pop("top_cpu_ops"))
                result[f"{trainer}_{plan}"] = run
            whole = result[f"{trainer}_whole"]["seconds"]
            for plan in ("parts", "recompute"):
                result[f"{trainer}_{plan}_over_whole"] = round(result[f"{trainer}_{plan}"]["seconds"] / whole, 2)
    os.environ.pop(MEMORY_VARIABLE, None)
    os.environ.pop(RECOMPUTE_VARIABLE, None)
    return finish("training_profile", result, args.record, argv)


if __name__ == "__main__":
    main()
