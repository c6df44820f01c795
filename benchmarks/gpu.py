"""One day's real load on the qwen3-0.6b shape (random weights, bf16, CUDA): generation, GSPO,
DPO and the judge, timed; the last line one JSON object.

    python -m benchmarks.gpu                 # CUDA: 30 headlines x 8 rollouts, ~200-token prompts, 512 new tokens
    python -m benchmarks.gpu --smoke         # the tiny version (what runs on CPU, and says so)

On a machine without CUDA it runs the smoke version on `qwen3-tiny` and labels every figure as a
CPU smoke figure: it checks the code paths, it measures nothing about a GPU.

- generation: the project's sampler (`models/torch/sampling.py`; on CUDA the static-cache, graph-captured
  path of `models/torch/graph_sampler.py`, its capture and warm-up timed apart) vs its eager loop vs `transformers` `generate`
  with the same settings (temperature 0.8, top-k 50, top-p 0.95, no early stop) vs vLLM
  (`models/torch/vllm_sampling.py`, when installed); output tokens/s each. Roofline: a decode
  step must read the weights and every row's KV cache once; at the measured device-to-device
  bandwidth that sets the fastest possible step; the fraction is that ideal time over the
  sampler's measured time.
- GSPO on the 240 rollouts, LoRA and full (fp32 master weights): seconds and peak memory;
  weighted DPO (LoRA) on 200 pairs; the judge (`Judge`, the project's defaults) on 30 groups of 8.
Anchor (not the same load): vLLM serves Qwen3-0.6B on one H100 at about 12k output tokens/s
(512 in, 128 out, many requests).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks._results import add_record_argument, finish
from outcome_flywheel.models.train.dpo import train_weighted_dpo
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.memory import MEMORY_VARIABLE

VLLM_ANCHOR_TOKENS_S = 12_000
# The static sampler's variants: (fuse_decode, decode_attention) of `TorchBackend`.
STATIC_VARIANTS = {"torch": (None, "sdpa"), "torch-unfused": (False, "sdpa"), "torch-flex": (None, "flex")}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _peak_reset(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None


def _allocated_gib(device) -> float | None:
    """What live tensors hold now (after a drop: what the dropped object failed to give back)."""
    if device.type != "cuda":
        return None
    gc.collect()
    torch.cuda.synchronize()
    return round(torch.cuda.memory_allocated() / 2**30, 3)


def copy_bandwidth_gbs(device, gib: float = 2.0) -> float | None:
    """Device-to-device copy, bytes read + written per second (the roofline's bandwidth)."""
    if device.type != "cuda":
        return None
    src = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    _sync(device)
    started = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    _sync(device)
    return round(2 * src.numel() * 2 * 10 / (time.perf_counter() - started) / 1e9, 1)


def decode_roofline_s(shape: str, rows: int, prompt_lengths: list[int], new_tokens: int, bandwidth_gbs: float) -> float:
    """Seconds a decode of `new_tokens` steps needs at least: per step, the weights plus every
    row's KV cache so far, read once at `bandwidth_gbs`."""
    from outcome_flywheel.models.provision.qwen3_shapes import kv_bytes_per_token, parameter_bytes

    weights, per_token = parameter_bytes(shape), kv_bytes_per_token(shape)
    context = sum(prompt_lengths) * rows // len(prompt_lengths)
    total = sum(weights + (context + rows * step) * per_token for step in range(new_tokens))
    return total / (bandwidth_gbs * 1e9)


def headline_prompts(backend, count: int, target_tokens: int) -> list[list[dict]]:
    """`count` note prompts from the bundled headlines (tiny-local's corpus), each summary extended
    with others until the prompt is about `target_tokens` long."""
    from outcome_flywheel.models.prompts import trading_note_messages
    from outcome_flywheel.models.provision.tiny_local import load_corpus

    items = load_corpus()
    prompts = []
    for i in range(count):
        head = items[i % len(items)]
        summary, j = head["summary"], i + 1
        while len(backend.prompt_ids(trading_note_messages(head["title"], summary))) < target_tokens:
            summary += " " + items[j % len(items)]["summary"]
            j += 1
        prompts.append(trading_note_messages(head["title"], summary))
    return prompts


def time_generation(backend, prompts, n, new_tokens, sampler: str) -> dict:
    """One timed call of a sampler at the load: "torch" (the static-cache, graph-captured sampler with
    its step's pieces fused; capture, compile and warm-up timed apart), "torch-unfused" (the same
    without fusion), "torch-flex" (fused, FlexAttention as the step's attention), "torch-eager" (the
    eager loop), "hf_generate", "vllm"."""
    from outcome_flywheel.models.interface import SamplingConfig
    from outcome_flywheel.models.torch.graph_sampler import sampling_rule

    config = SamplingConfig(
        temperature=0.8,
        top_p=0.95,
        top_k=50,
        max_new_tokens=new_tokens,
        prompts_per_batch=len(prompts),
        ignore_eos=True,
    )
    device = backend.device
    if sampler == "hf_generate":
        return _time_hf_generate(backend, prompts, n, config)
    backend.sampler = "vllm" if sampler == "vllm" else "torch"
    backend.static_decode = sampler in STATIC_VARIANTS and device.type == "cuda"
    variant = STATIC_VARIANTS.get(sampler, STATIC_VARIANTS["torch"])
    if (backend.fuse_decode, backend.decode_attention) != variant:  # another kind: its graphs go, new ones are captured
        backend.release_inference_state()
        backend.fuse_decode, backend.decode_attention = variant
    backend.sample(prompts[:2], 2, SamplingConfig(**{**config.__dict__, "max_new_tokens": 8}), seeds=[0, 1])  # warm-up
    out: dict = {}
    engine = backend.graph_sampler
    if engine is not None:  # what the first call of this shape pays, once per model load
        width = max(len(backend.prompt_ids(p, config.enable_thinking)) for p in prompts)
        _sync(device)
        started = time.perf_counter()
        engine.prepare(len(prompts) * n, width, new_tokens, sampling_rule(backend, config, backend.vocab_size))
        _sync(device)
        out.update(
            capture_and_warmup_s=round(time.perf_counter() - started, 2),
            graphs=engine.stats.captures,
            static_cache_gib=round(engine.stats.cache_bytes / 2**30, 2),
            fused_pieces=engine.kernels.fused_pieces,
            **({"fusion_failures": dict(engine.kernels.failures)} if engine.kernels.failures else {}),
        )
        captured = engine.stats.captures
    _sync(device)
    started = time.perf_counter()
    groups = backend.sample(prompts, n, config, seeds=list(range(len(prompts))))
    _sync(device)
    seconds = time.perf_counter() - started
    if engine is not None:
        out.update(captures_in_timed_call=engine.stats.captures - captured, fallbacks=dict(engine.stats.fallbacks))
    backend.sampler, backend.static_decode = "torch", device.type == "cuda"
    if variant != STATIC_VARIANTS["torch"]:
        backend.release_inference_state()
        backend.fuse_decode, backend.decode_attention = STATIC_VARIANTS["torch"]
    tokens = sum(len(s.token_ids) for g in groups for s in g)
    return {
        "seconds": round(seconds, 2),
        "output_tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 1),
        **out,
        "groups": groups,
    }


def _time_hf_generate(backend, prompts, n, config) -> dict:
    from outcome_flywheel.models.torch.sampling import left_padded

    ids = [backend.prompt_ids(p) for p in prompts]
    input_ids, attention, _ = left_padded(ids, backend.tokenizer.pad_token_id, backend.device)
    kwargs = dict(
        do_sample=True,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        num_return_sequences=n,
        pad_token_id=backend.tokenizer.pad_token_id,
    )
    with torch.inference_mode():
        backend.model.generate(
            input_ids=input_ids[:2], attention_mask=attention[:2], max_new_tokens=8, min_new_tokens=8, **kwargs
        )
        _sync(backend.device)
        started = time.perf_counter()
        out = backend.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=config.max_new_tokens,
            min_new_tokens=config.max_new_tokens,
            **kwargs,
        )
        _sync(backend.device)
    seconds = time.perf_counter() - started
    tokens = int(out.shape[0] * (out.shape[1] - input_ids.shape[1]))
    return {"seconds": round(seconds, 2), "output_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)}


def note_texts(backend, groups) -> list[list[str]]:
    """The rollouts as text of their full length (`folded_text`)."""
    return [[folded_text(backend, s.token_ids) for s in g] for g in groups]


def folded_text(backend, token_ids) -> str:
    """Sampled ids as text of their length: a random-weight model samples ids across the whole 151,936
    vocabulary, most beyond the fixture tokenizer's few thousand (they decode to nothing), so each id
    is folded into the tokenizer's range first (no special or think ids). The judge and DPO then see
    notes of the sampled length, as with a real model."""
    size = len(backend.tokenizer)
    return backend.decode([5 + t % (size - 7) for t in token_ids])


def time_training(model_dir, device, prompts, groups, texts, pairs_wanted: int, gspo_epochs: int | None = None) -> dict:
    from outcome_flywheel.daily_rl.reward.signals import group_advantages
    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.train.dpo_config import PreferencePair, WeightedDPOConfig
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

    rng = np.random.default_rng(0)
    examples = []
    for prompt, group in zip(prompts, groups):
        advantages = group_advantages(list(rng.random(len(group))))
        examples += [GSPOExample(prompt, s.token_ids, s.logprobs, float(a)) for s, a in zip(group, advantages)]
    out = {"gspo_rollouts": len(examples), "gspo_response_tokens": sum(len(e.response_ids) for e in examples)}
    for name, lora in (("lora", GSPOConfig().lora), ("full", None)):
        policy = TorchBackend(model_dir, device=str(device))
        _peak_reset(device)
        config = GSPOConfig(
            lora=lora,
            temperature=0.8,
            learning_rate=1e-4 if lora else 1e-5,
            **({"epochs": gspo_epochs} if gspo_epochs else {}),
        )
        _sync(device)
        started = time.perf_counter()
        stats = train_gspo(policy, examples, config)
        _sync(device)
        out[f"gspo_{name}_s"] = round(time.perf_counter() - started, 2)
        out[f"gspo_{name}_loop_s"] = round(stats.wall_s, 2)  # the optimiser steps alone, without the setup
        out[f"gspo_{name}_steps"] = stats.steps
        out[f"gspo_{name}_peak_gib"] = _peak_gib(device)
        out[f"gspo_{name}_finite"] = bool(np.isfinite(stats.losses).all())
        out[f"gspo_{name}_micro_batches"] = stats.extra.get("micro_batches")
        out[f"gspo_{name}_token_limit"] = stats.extra.get("token_limit")  # the memory budget's (models/train/memory.py)
        out[f"gspo_{name}_recompute"] = stats.extra.get("recompute")  # the layers recomputed (torch/recompute.py)
        del policy
        out[f"allocated_after_gspo_{name}_dropped_gib"] = _allocated_gib(device)
    texts = [t for g in texts for t in g]
    pairs = [
        PreferencePair(
            prompts[i % len(prompts)],
            texts[(2 * i) % len(texts)],
            texts[(2 * i + 1) % len(texts)],
            float(rng.uniform(0.3, 1.5)),
        )
        for i in range(pairs_wanted)
    ]
    policy = TorchBackend(model_dir, device=str(device))
    _peak_reset(device)
    _sync(device)
    started = time.perf_counter()
    stats = train_weighted_dpo(policy, pairs, WeightedDPOConfig(epochs=1, completion_unit="sequence"))
    _sync(device)
    out.update(
        dpo_pairs=len(pairs),
        dpo_s=round(time.perf_counter() - started, 2),
        dpo_loop_s=round(stats.wall_s, 2),  # the steps alone: the rest is the adapter, encoding, the reference pass
        dpo_steps=stats.steps,
        dpo_peak_gib=_peak_gib(device),
        dpo_micro_batches=stats.extra.get("micro_batches"),
        dpo_token_limit=stats.extra.get("token_limit"),
        dpo_recompute=stats.extra.get("recompute"),
    )
    del policy
    out["allocated_after_dpo_dropped_gib"] = _allocated_gib(device)
    return out


def time_judge(backend, prompts, texts) -> dict:
    from outcome_flywheel.daily_rl.judge.llm_judge import Judge
    from outcome_flywheel.daily_rl.judge.ranking import JudgeGroup

    judge = Judge()
    jgroups = [
        JudgeGroup(p[-1]["content"].splitlines()[0], ["Shares moved 2% the next day"], g[:8], seed=i)
        for i, (p, g) in enumerate(zip(prompts, texts))
    ]
    _sync(backend.device)
    started = time.perf_counter()
    judged = judge.rank(backend, jgroups)
    _sync(backend.device)
    return {
        "judge_groups": len(jgroups),
        "judge_s": round(time.perf_counter() - started, 2),
        "judge_notes_truncated": int(sum(sum(j.truncated(k) for k in range(len(j.ranks))) for j in judged)),
        "judge_max_prompt_tokens": max(j.prompt_tokens for j in judged),
    }


def profile_samplers(backend, prompts, n, steps, samplers) -> dict:
    """Where a decode step's time goes in each of `samplers` (the top kernels and CPU ops)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if backend.device.type == "cuda" else [])
    out = {}
    for sampler in samplers:
        time_generation(backend, prompts, n, 64, sampler)  # warm-up: captures and compiles stay out
        with profile(activities=activities) as prof:
            timed = time_generation(backend, prompts, n, steps, sampler)
        timed.pop("groups", None)
        out[sampler] = timed
        sort = "self_cuda_time_total" if backend.device.type == "cuda" else "self_cpu_time_total"
        print(f"== {sampler}: {timed}")
        print(prof.key_averages().table(sort_by=sort, row_limit=14, max_name_column_width=60))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=60))
    print(json.dumps(out))
    return out


def load_arguments(parser: argparse.ArgumentParser, headlines: int) -> None:
    """The arguments that set the load (benchmarks.training_profile takes them too)."""
    parser.add_argument("--smoke", action="store_true", help="the tiny version (always, without CUDA)")
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument("--headlines", type=int, default=headlines)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=512)


def run_header(benchmark: str, smoke: bool, shape: str) -> dict:
    """What every figure of a run depends on: the machine, the device, torch, the model's shape."""
    cuda = torch.cuda.is_available()
    return {
        "benchmark": benchmark,
        "smoke": smoke,
        "machine": platform.node(),
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.machine()})",
        "torch": torch.__version__,
        "shape": shape,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    load_arguments(parser, headlines=30)
    parser.add_argument("--dpo-pairs", type=int, default=200)
    parser.add_argument("--gspo-epochs", type=int, default=None, help="GSPO's passes (default: GSPOConfig's)")
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="profile this many decode steps of each sampler (torch.profiler) and stop",
    )
    parser.add_argument(
        "--profile-samplers",
        default="torch,torch-unfused,torch-eager,hf_generate",
        help="the samplers --profile-steps profiles, comma-separated",
    )
    parser.add_argument(
        "--skip", default="", help="comma list of parts to skip: unfused,flex,eager,hf_generate,vllm,training,judge"
    )
    add_record_argument(parser)
    args = parser.parse_args(argv)

    from outcome_flywheel.models.provision.qwen3_shapes import benchmark_model
    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.torch.vllm_sampling import vllm_unavailable_reason

    cuda = torch.cuda.is_available()
    smoke = args.smoke or not cuda
    if smoke:
        args.shape, args.headlines, args.rollouts, args.prompt_tokens, args.new_tokens, args.dpo_pairs = (
            "qwen3-tiny",
            2,
            2,
            40,
            16,
            4,
        )
        print(
            "SMOKE RUN"
            + ("" if cuda else " (no CUDA here)")
            + ": qwen3-tiny, 2 headlines x 2 rollouts, 16 new tokens. "
            "It checks the code paths; its figures say nothing about a GPU."
        )
    device = torch.device("cuda" if cuda else "cpu")
    skip = set(filter(None, args.skip.split(",")))
    result: dict = {
        **run_header("gpu", smoke, args.shape),
        "headlines": args.headlines,
        "rollouts": args.rollouts,
        "new_tokens": args.new_tokens,
    }
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        model_dir = benchmark_model(Path(tmp) / args.shape, args.shape)
        result["build_s"] = round(time.perf_counter() - started, 1)
        result["allocated_start_gib"] = _allocated_gib(device)
        backend = TorchBackend(model_dir, device=str(device))
        prompts = headline_prompts(backend, args.headlines, args.prompt_tokens)
        prompt_lengths = [len(backend.prompt_ids(p)) for p in prompts]
        result["prompt_tokens_mean"] = round(float(np.mean(prompt_lengths)), 1)

        if args.profile_steps:
            return profile_samplers(
                backend, prompts, args.rollouts, args.profile_steps, args.profile_samplers.split(",")
            )
        own = time_generation(backend, prompts, args.rollouts, args.new_tokens, "torch")
        groups = own.pop("groups")
        texts = note_texts(backend, groups)
        result["sampler"] = own
        print(
            f"project sampler (static cache + CUDA graphs on CUDA): {own['tokens_per_s']} output tokens/s "
            f"({own['output_tokens']} tokens in {own['seconds']} s; capture and warm-up {own.get('capture_and_warmup_s')} s, once per model load)"
        )
        if "unfused" not in skip and cuda:
            unfused = time_generation(backend, prompts, args.rollouts, args.new_tokens, "torch-unfused")
            unfused_groups = unfused.pop("groups")
            result["unfused_sampler"] = unfused
            result["fused_vs_unfused"] = round(own["tokens_per_s"] / unfused["tokens_per_s"], 2)
            result["bf16_rows_identical_to_unfused"] = round(
                float(
                    np.mean([a.token_ids == b.token_ids for g, h in zip(groups, unfused_groups) for a, b in zip(g, h)])
                ),
                3,
            )
            print(
                f"unfused static sampler: {unfused['tokens_per_s']} output tokens/s; fused/unfused = {result['fused_vs_unfused']}x"
            )
        if "flex" not in skip and cuda:
            flex = time_generation(backend, prompts, args.rollouts, args.new_tokens, "torch-flex")
            flex.pop("groups")
            result["flex_sampler"] = flex
            result["flex_vs_sdpa"] = round(flex["tokens_per_s"] / own["tokens_per_s"], 2)
            print(
                f"static sampler, FlexAttention: {flex['tokens_per_s']} output tokens/s; flex/sdpa = {result['flex_vs_sdpa']}x"
            )
        if "eager" not in skip and cuda:
            eager = time_generation(backend, prompts, args.rollouts, args.new_tokens, "torch-eager")
            eager_groups = eager.pop("groups")
            result["eager_sampler"] = eager
            result["static_vs_eager"] = round(own["tokens_per_s"] / eager["tokens_per_s"], 2)
            # bf16: the two take different attention kernels, so tokens agree only until a near-tie flips one
            same = [a.token_ids == b.token_ids for g, h in zip(groups, eager_groups) for a, b in zip(g, h)]
            first_tokens = [
                a.token_ids[0] == b.token_ids[0] for g, h in zip(groups, eager_groups) for a, b in zip(g, h)
            ]
            result["bf16_rows_identical_to_eager"] = round(float(np.mean(same)), 3)
            result["bf16_first_token_identical"] = round(float(np.mean(first_tokens)), 3)
            print(
                f"eager sampler: {eager['tokens_per_s']} output tokens/s; static/eager = {result['static_vs_eager']}x"
            )
        bandwidth = copy_bandwidth_gbs(device)
        if bandwidth:
            ideal = decode_roofline_s(
                args.shape, args.headlines * args.rollouts, prompt_lengths, args.new_tokens, bandwidth
            )
            result.update(
                copy_bandwidth_gbs=bandwidth,
                roofline_s=round(ideal, 2),
                sampler_roofline_fraction=round(ideal / own["seconds"], 3),
            )
            for other in ("flex", "unfused", "eager"):
                if f"{other}_sampler" in result:
                    result[f"{other}_roofline_fraction"] = round(ideal / result[f"{other}_sampler"]["seconds"], 3)
            print(
                f"decode roofline at {bandwidth} GB/s: {ideal:.2f} s; the sampler reaches {ideal / own['seconds']:.1%} of it"
            )
        if "hf_generate" not in skip:
            hf = time_generation(backend, prompts, args.rollouts, args.new_tokens, "hf_generate")
            result["hf_generate"] = hf
            print(f"transformers generate: {hf['tokens_per_s']} output tokens/s")
        reason = vllm_unavailable_reason()
        if "vllm" in skip or reason:
            result["vllm"] = {"skipped": "skipped by --skip" if "vllm" in skip else reason}
            print(f"vLLM: not run ({result['vllm']['skipped']})")
        else:
            fast = time_generation(backend, prompts, args.rollouts, args.new_tokens, "vllm")
            fast.pop("groups")
            result["vllm"] = fast
            result["sampler_vs_vllm"] = round(own["tokens_per_s"] / fast["tokens_per_s"], 3)
            print(f"vLLM: {fast['tokens_per_s']} output tokens/s")
        if not smoke:
            result["sampler_vs_vllm_anchor"] = round(own["tokens_per_s"] / VLLM_ANCHOR_TOKENS_S, 3)
        del backend
        # the static cache and graphs go with the backend before training measures its peak: each
        # part is measured in a clean state, and what a dropped backend kept is reported
        result["allocated_after_sampler_dropped_gib"] = _allocated_gib(device)
        if "training" not in skip:
            result.update(time_training(model_dir, device, prompts, groups, texts, args.dpo_pairs, args.gspo_epochs))
            result["train_memory_gib_setting"] = os.environ.get(MEMORY_VARIABLE) or "default (80% of free)"
            print(
                f"GSPO on {result['gspo_rollouts']} rollouts: LoRA {result['gspo_lora_s']} s (peak {result['gspo_lora_peak_gib']} GiB), "
                f"full {result['gspo_full_s']} s (peak {result['gspo_full_peak_gib']} GiB); DPO on {result['dpo_pairs']} pairs: {result['dpo_s']} s"
            )
        if "judge" not in skip:
            judge_backend = TorchBackend(model_dir, device=str(device))
            result.update(time_judge(judge_backend, prompts, texts))
            if judge_backend.graph_sampler is not None:  # which of the judge's decodes took the static path
                stats = judge_backend.graph_sampler.stats
                result["judge_static_calls"], result["judge_eager_calls"] = stats.calls, dict(stats.fallbacks)
            print(f"judge on {result['judge_groups']} groups of {args.rollouts}: {result['judge_s']} s")
            del judge_backend
            result["allocated_after_judge_dropped_gib"] = _allocated_gib(device)
        if "gspo_lora_s" in result:
            # the day's GPU work end to end: sampling (capture included), the judge, the GSPO LoRA update
            result["gspo_day_s"] = round(
                own["seconds"] + own.get("capture_and_warmup_s", 0) + result.get("judge_s", 0) + result["gspo_lora_s"],
                2,
            )
            print(f"GSPO day end to end (sampling with capture, judge, LoRA update): {result['gspo_day_s']} s")
    return finish("gpu", result, args.record, argv)


if __name__ == "__main__":
    main()
