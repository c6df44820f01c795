"""Peak memory of one GSPO training step at Qwen3's vocabulary (151,936), before and after the
selective log-probs (`models/torch/logprobs.py`, `models/mlx/logprobs.py`).

The model is `wide-vocab-toy` (`models/provision/qwen3_shapes.py`): the real vocabulary on a tiny body, so
the logits dominate memory as they do at Qwen3-0.6B's scale. One step = teacher-forced log-probs
of `--batch` responses of `--response-tokens` tokens, the GSPO loss, backward, AdamW.

- before ("plain"): the former code path, full fp32 logits of the response tail, a gathered
  `[B, R, V]` copy and a logsumexp over it;
- after ("selective"): the backends' `batch_logprobs` today.

Each measurement runs in its own process. Peak: CUDA `max_memory_allocated`; mlx
`get_peak_memory`; torch on CPU the process's peak RSS less its RSS before the step (the model,
batch and allocator already in place). Usage:

    python -m benchmarks.logprob_memory [--batch 16 --response-tokens 512] [--frameworks torch,mlx]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._results import add_record_argument, finish

VARIANTS = ("plain", "selective")


def _rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def _batch(vocab: int, batch: int, prompt_tokens: int, response_tokens: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    prompts = [[int(x) for x in rng.integers(5, vocab, prompt_tokens + (i % 3))] for i in range(batch)]
    responses = [[int(x) for x in rng.integers(5, vocab, response_tokens)] for _ in range(batch)]
    return prompts, responses


def _torch_plain_logprobs(backend, prompt_ids, response_ids, temperature):
    """The former `TorchBackend.batch_logprobs`: fp32 logits of the tail, gathered to [B, R, V]."""
    import torch

    input_ids, attention = backend._right_padded(prompt_ids, response_ids)
    width, resp_len = input_ids.shape[1], max(len(r) for r in response_ids)
    keep = width - min(len(p) for p in prompt_ids) + 1
    logits = (
        backend.model(input_ids=input_ids, attention_mask=attention, logits_to_keep=keep).logits.float() / temperature
    )
    offset = width - keep
    gather_pos = torch.zeros((len(response_ids), resp_len), dtype=torch.long)
    targets = torch.zeros((len(response_ids), resp_len), dtype=torch.long)
    mask = torch.zeros((len(response_ids), resp_len), dtype=torch.bool)
    for b, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        gather_pos[b, : len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r)) - offset
        targets[b, : len(r)] = torch.tensor(r)
        mask[b, : len(r)] = True
    gather_pos, targets, mask = gather_pos.to(backend.device), targets.to(backend.device), mask.to(backend.device)
    picked = logits.gather(1, gather_pos[:, :, None].expand(-1, -1, logits.shape[-1]))
    logp = picked.gather(-1, targets[:, :, None])[:, :, 0] - torch.logsumexp(picked, dim=-1)
    return logp.masked_fill(~mask, 0.0), mask


def _torch_step(model_dir: str, variant: str, args) -> dict:
    import torch

    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.torch.losses import gspo_loss

    backend = TorchBackend(model_dir, device=args.device, dtype="float32")
    backend.model.train()
    opt = torch.optim.AdamW(backend.model.parameters(), lr=1e-4)
    prompts, responses = _batch(backend.vocab_size, args.batch, args.prompt_tokens, args.response_tokens)
    cuda = backend.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    else:
        before = _rss_mib()
    started = time.perf_counter()
    fn = _torch_plain_logprobs if variant == "plain" else lambda b, p, r, t: b.batch_logprobs(p, r, t)
    logp, mask = fn(backend, prompts, responses, 0.8)
    advantages = torch.linspace(-1, 1, len(responses), device=backend.device)
    loss, _ = gspo_loss(logp, logp.detach(), mask, advantages)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "step_mib": round(peak - before, 1),
        "baseline_mib": round(before, 1),
        "seconds": round(time.perf_counter() - started, 2),
        "mean_logp": round(float((logp * mask).sum() / mask.sum()), 6),
        "device": str(backend.device),
    }


def _mlx_plain_logprobs(backend, prompt_ids, response_ids, temperature):
    """The former `MLXBackend.batch_logprobs`: the logits tail, gathered to [B, R, V]."""
    import mlx.core as mx

    inputs, gather_pos, targets, mask, keep = backend._teacher_forcing_layout(prompt_ids, response_ids)
    logits = backend.lm_head(backend.model.model(mx.array(inputs))[:, -keep:, :]).astype(mx.float32) / temperature
    picked = mx.take_along_axis(logits, mx.array(gather_pos)[:, :, None], axis=1)
    chosen = mx.take_along_axis(picked, mx.array(targets)[:, :, None], axis=-1)[:, :, 0]
    mask_mx = mx.array(mask)
    return mx.where(mask_mx, chosen - mx.logsumexp(picked, axis=-1), 0.0), mask_mx


def _mlx_step(model_dir: str, variant: str, args) -> dict:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    from outcome_flywheel.models.mlx.backend import MLXBackend
    from outcome_flywheel.models.mlx.losses import gspo_loss

    backend = MLXBackend(model_dir, dtype="float32")
    backend.model.train()
    prompts, responses = _batch(backend.vocab_size, args.batch, args.prompt_tokens, args.response_tokens)
    fn = _mlx_plain_logprobs if variant == "plain" else lambda b, p, r, t: b.batch_logprobs(p, r, t)
    advantages = mx.linspace(-1, 1, len(responses))

    def loss_fn(model):
        logp, mask = fn(backend, prompts, responses, 0.8)
        return gspo_loss(logp, mx.stop_gradient(logp), mask, advantages)[0], (logp * mask).sum() / mask.sum()

    opt = optim.AdamW(learning_rate=1e-4)
    mx.eval(backend.model.parameters())
    mx.reset_peak_memory()
    before = mx.get_active_memory() / 2**20
    started = time.perf_counter()
    (loss, mean_logp), grads = nn.value_and_grad(backend.model, loss_fn)(backend.model)
    opt.update(backend.model, grads)
    mx.eval(backend.model.parameters(), opt.state, loss, mean_logp)
    peak = mx.get_peak_memory() / 2**20
    return {
        "step_mib": round(peak - before, 1),
        "baseline_mib": round(before, 1),
        "seconds": round(time.perf_counter() - started, 2),
        "mean_logp": round(float(mean_logp), 6),
        "device": str(mx.default_device()),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--response-tokens", type=int, default=512)
    parser.add_argument("--frameworks", default="torch,mlx")
    parser.add_argument("--device", default="auto", help="torch device (auto: cuda, then cpu)")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # framework:variant:model_dir, in a child process
    add_record_argument(parser)
    args = parser.parse_args(argv)
    if args.run:
        framework, variant, model_dir = args.run.split(":", 2)
        step = _torch_step if framework == "torch" else _mlx_step
        print(json.dumps(step(model_dir, variant, args)))
        return {}

    from outcome_flywheel.models.provision.qwen3_shapes import build_model

    results: dict = {
        "benchmark": "logprob_memory",
        "machine": f"{platform.machine()} {platform.node()}",
        "shape": "wide-vocab-toy",
        "vocab": 151_936,
        "batch": args.batch,
        "response_tokens": args.response_tokens,
        "prompt_tokens": args.prompt_tokens,
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_model(Path(tmp) / "model", "wide-vocab-toy", seed=0))
        for framework in [f for f in args.frameworks.split(",") if f]:
            if framework == "mlx":
                try:
                    import mlx.core  # noqa: F401
                except ImportError:
                    print("mlx: not installed, skipped")
                    continue
            for variant in VARIANTS:
                cmd = [
                    sys.executable,
                    "-m",
                    "benchmarks.logprob_memory",
                    "--run",
                    f"{framework}:{variant}:{model_dir}",
                    "--batch",
                    str(args.batch),
                    "--prompt-tokens",
                    str(args.prompt_tokens),
                    "--response-tokens",
                    str(args.response_tokens),
                    "--device",
                    args.device,
                ]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    line = (done.stderr.strip().splitlines() or ["failed"])[-1]
                    print(f"{framework} {variant}: failed ({line})")
                    results[f"{framework}_{variant}"] = {"error": line}
                    continue
                result = json.loads(done.stdout.strip().splitlines()[-1])
                results[f"{framework}_{variant}"] = result
                print(
                    f"{framework:5s} {variant:9s} step peak {result['step_mib']:9.1f} MiB over {result['baseline_mib']:.0f} MiB "
                    f"({result['device']}), {result['seconds']} s, mean logp {result['mean_logp']}"
                )
            plain, selective = results.get(f"{framework}_plain", {}), results.get(f"{framework}_selective", {})
            if "step_mib" in plain and "step_mib" in selective:
                results[f"{framework}_reduction"] = round(plain["step_mib"] / max(selective["step_mib"], 1e-9), 2)
    return finish("logprob_memory", results, args.record, argv)


if __name__ == "__main__":
    main()
