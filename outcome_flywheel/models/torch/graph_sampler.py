"""The static-cache sampler: the same samples as the eager sampler (`sampling.py`), decoded over a
preallocated KV cache (`static_cache.py`) with each decode step captured once in a CUDA graph.

What makes a step capturable, and what keeps it exact:
- Fixed shapes. The batch is padded to a bucket (`batch_bucket`: powers of two to 16, then steps
  of 16); rows that finish are masked (they keep decoding a pad token and record nothing), never
  removed. Attention reads the cache up to a length bucket (`LENGTH_BUCKET` positions), so a
  step reads about the live length, not the whole allocation; one graph per (batch bucket, length
  bucket, sampling rule).
- No host round trips. The top-k / top-p threshold is computed on the device
  (`device_keep_thresholds`, the rule of `models/sampling.py` in float64), the think ban is a
  fixed index list, and "have all rows stopped?" is read once every `STOP_CHECK_EVERY` steps.
- The same random numbers. Each row's uniforms are drawn up front from its own `row_seed`
  generator, exactly as the eager sampler draws them, into a static buffer the graph indexes by a
  device-side step counter; the inverse-CDF lookup over the vocabulary in token order is the
  eager sampler's. With the same logits the two pick the same tokens, and pi_old (log-softmax of
  logits / T over the whole vocabulary) is the same quantity.
- Captured once per model load. Graphs read the model's parameters where they live, so training
  in place (optimiser steps, LoRA updates) needs no recapture; a new set of parameter tensors (a
  new adapter, a dtype change) or a cache too small for the call rebuilds them.

Off CUDA the same step runs eagerly (`use_graphs=False`): that is how the CPU tests check it.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch

from outcome_flywheel.models.sampling import candidate_count
from outcome_flywheel.models.torch.fused_decode import DecodeKernels
from outcome_flywheel.models.torch.static_cache import (
    StaticKVCache,
    attention_kernels,
    causal_lm,
    decode_step,
    unsupported_reason,
)

LENGTH_BUCKET = 128
STOP_CHECK_EVERY = 16
# Below this many new tokens a call is not worth capturing graphs for (the judge's one-letter retry).
MIN_GRAPH_TOKENS = 32
# The static cache may take at most this share of the free device memory; beyond it, eager decoding.
CACHE_MEMORY_SHARE = 0.5


_CAPTURE_STREAMS: dict[torch.device, "torch.cuda.Stream"] = {}


def capture_stream(device: torch.device) -> "torch.cuda.Stream":
    """The one side stream every capture on `device` warms up on: cuBLAS keeps a workspace for each
    stream it has run on until the process ends, so a new stream per capture would leave one behind
    each time (memory a long-lived server never gets back)."""
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


def batch_bucket(rows: int) -> int:
    """The padded batch a graph is captured for: powers of two to 16, then multiples of 16."""
    return 1 << max(rows - 1, 0).bit_length() if rows <= 16 else -(-rows // 16) * 16


def length_bucket(length: int) -> int:
    return -(-length // LENGTH_BUCKET) * LENGTH_BUCKET


@dataclass(frozen=True)
class SamplingRule:
    """What a captured step bakes in besides shapes."""

    temperature: float
    top_k: int  # candidate count: the vocabulary size when top-k is off
    top_p: float
    banned: tuple[int, ...]
    stop: tuple[int, ...]
    pad: int

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass
class EngineStats:
    """What the engine did since the model was loaded (the benchmark reports it)."""

    captures: int = 0
    capture_s: float = 0.0
    allocations: int = 0
    cache_bytes: int = 0
    calls: int = 0
    steps: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)


class GraphSampler:
    """One per loaded model (`TorchBackend.graph_sampler`)."""

    # Buffers the captured graphs read and write (made in `_ensure_capacity`), dropped by `close`.
    BUFFERS = (
        "key_bias",
        "tokens",
        "positions",
        "write_at",
        "step",
        "logits",
        "uniforms",
        "done",
        "out_tokens",
        "out_logps",
        "out_alive",
    )

    def __init__(self, backend, use_graphs: bool | None = None, fuse: bool | None = None, attention: str = "sdpa"):
        """`use_graphs`: capture each step in a CUDA graph (None: on CUDA). `fuse`: compile the
        step's norms, rotations and gates into one kernel each (`fused_decode.py`; None: with graphs,
        where launches set the step's time). `attention`: the step's attention kernel, "sdpa" or
        "flex" (`fused_decode.DecodeKernels`)."""
        # A weak reference: the backend holds its sampler, so a strong one back would make a cycle,
        # and a dropped backend's cache and graphs would wait for the garbage collector.
        self._backend = weakref.ref(backend)
        self.device = backend.device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.kernels = DecodeKernels(fused=self.use_graphs if fuse is None else fuse, attention=attention)
        self.stats = EngineStats()
        self._cache: StaticKVCache | None = None
        self._graphs: dict[tuple, object] = {}
        self._pool = None
        self._weights_key: tuple | None = None
        self._rule_ids: dict[SamplingRule, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def backend(self):
        backend = self._backend()
        if backend is None:
            raise RuntimeError("the model this sampler decoded for has been dropped")
        return backend

    def close(self) -> None:
        """Give back the static cache, every captured graph (`CUDAGraph.reset` frees what its
        private pool holds) and the buffers they read; the sampler can be used again after."""
        for graph in self._graphs.values():
            if hasattr(graph, "reset"):
                graph.reset()
        self._graphs.clear()
        self._cache = None
        self._pool = None
        self._weights_key = None
        self._rule_ids.clear()
        for name in self.BUFFERS:
            self.__dict__.pop(name, None)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to give back
            pass

    # -- when it applies --------------------------------------------------------------------
    def unusable_reason(self, rows: int, width: int, max_new_tokens: int) -> str:
        """Why this call decodes eagerly ("" when the static path takes it); counted in `stats.fallbacks`."""
        reason = self._unusable_reason(rows, width, max_new_tokens)
        if reason:
            self.stats.fallbacks[reason] = self.stats.fallbacks.get(reason, 0) + 1
        return reason

    def _unusable_reason(self, rows: int, width: int, max_new_tokens: int) -> str:
        model = self.backend.model
        if self.backend.master_weights:
            return "fp32 master weights under autocast"
        if model.training and any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
            return "dropout active (model in training mode)"
        reason = unsupported_reason(model)
        if reason:
            return reason
        if self.use_graphs and max_new_tokens < MIN_GRAPH_TOKENS:
            return f"fewer than {MIN_GRAPH_TOKENS} new tokens"
        if self.device.type == "cuda" and not self._fits(rows, width + max_new_tokens):
            return "static cache larger than the free device memory allows"
        return ""

    def _fits(self, rows: int, length: int) -> bool:
        if self._cache is not None and rows <= self._cache.batch and length <= self._cache.length:
            return True
        free, _ = torch.cuda.mem_get_info(self.device)
        held = self._cache.nbytes if self._cache is not None else 0
        need = StaticKVCache.bytes_needed(
            self.backend.model, batch_bucket(rows), length_bucket(length), self.backend.dtype
        )
        return need <= CACHE_MEMORY_SHARE * (free + held)

    # -- buffers and graphs -----------------------------------------------------------------
    def _weights_fingerprint(self) -> tuple:
        """Where every parameter and buffer lives: a graph read them there when it was captured."""
        model = self.backend.model
        tensors = list(model.parameters()) + list(model.buffers())
        return (id(model),) + tuple((t.data_ptr(), t.dtype) for t in tensors)

    def _ensure_capacity(self, rows: int, length: int) -> None:
        fingerprint = self._weights_fingerprint()
        if fingerprint != self._weights_key:
            self._graphs.clear()
            self._weights_key = fingerprint
        cache = self._cache
        if cache is not None and rows <= cache.batch and length <= cache.length:
            return
        batch = max(batch_bucket(rows), cache.batch if cache else 0)
        length = max(length_bucket(length), cache.length if cache else 0)
        if cache is not None and self.device.type == "cuda" and not self._fits(batch, length):
            batch, length = batch_bucket(rows), length_bucket(length)  # grow to this call only
        self._graphs.clear()
        self._cache = None
        model, dtype, device = self.backend.model, self.backend.dtype, self.device
        self._cache = StaticKVCache.for_model(model, batch, length, dtype, device)
        vocab = int(causal_lm(model).get_output_embeddings().weight.shape[0])
        self.key_bias = torch.full((batch, length), float("-inf"), dtype=dtype, device=device)
        self.tokens = torch.zeros(batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, dtype=torch.long, device=device)
        self.write_at = torch.zeros(1, dtype=torch.long, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)
        self.logits = torch.zeros((batch, vocab), dtype=torch.float32, device=device)
        self.uniforms = torch.zeros((batch, length), dtype=torch.float64, device=device)
        self.done = torch.ones(batch, dtype=torch.bool, device=device)
        self.out_tokens = torch.zeros((batch, length), dtype=torch.long, device=device)
        self.out_logps = torch.zeros((batch, length), dtype=torch.float32, device=device)
        self.out_alive = torch.zeros((batch, length), dtype=torch.bool, device=device)
        self.stats.allocations += 1
        self.stats.cache_bytes = self._cache.nbytes

    def _rule_tensors(self, rule: SamplingRule) -> tuple[torch.Tensor, torch.Tensor]:
        """The rule's banned and stop ids on the device, made once: a graph cannot copy from the host."""
        if rule not in self._rule_ids:
            as_ids = lambda ids: torch.tensor(ids or [-1], dtype=torch.long, device=self.device)  # noqa: E731
            self._rule_ids[rule] = (as_ids(rule.banned), as_ids(rule.stop))
        return self._rule_ids[rule]

    def _sample_step(self, rows: int, length: int, rule: SamplingRule) -> None:
        """Pick every row's token from `self.logits`, record it, then run it through the model: the
        body a graph captures. Mirrors `sampling._decode` step for step."""
        banned, stop = self._rule_tensors(rule)
        logits = self.logits[:rows]
        uniforms = self.uniforms[:rows].index_select(1, self.step) if not rule.greedy else None
        chosen, logp = pick_tokens(self.kernels, logits, uniforms, banned, rule)
        alive = ~self.done[:rows]
        chosen = torch.where(alive, chosen, rule.pad)
        self.out_tokens[:rows].index_copy_(1, self.step, chosen[:, None])
        self.out_logps[:rows].index_copy_(1, self.step, torch.where(alive, logp, 0.0)[:, None])
        self.out_alive[:rows].index_copy_(1, self.step, alive[:, None])
        if rule.stop:
            self.done[:rows] |= torch.isin(chosen, stop)
        self.key_bias[:rows].index_fill_(1, self.write_at, 0.0)
        self.logits[:rows].copy_(  # read into float32 as it is copied: no float32 copy in between
            decode_step(
                self.backend.model,
                self._cache,
                rows,
                length,
                chosen,
                self.positions[:rows],
                self.write_at,
                self.key_bias[:rows],
                self.kernels,
            )
        )
        self.positions[:rows] += 1
        self.write_at += 1
        self.step += 1

    def _capture(self, rows: int, length: int, rule: SamplingRule):
        """A CUDA graph of one step (after two warm-up runs on a side stream, as PyTorch asks);
        the buffers' contents are scratch until the prefill fills them."""
        self._rule_tensors(rule)
        self.write_at.zero_()
        self.step.zero_()
        stream = capture_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._sample_step(rows, length, rule)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # Every tensor that outlives a replay is a buffer allocated outside the graph, so the
        # graphs can share one memory pool and replay in any order.
        with torch.cuda.graph(graph, pool=self._pool):
            self._sample_step(rows, length, rule)
        return graph

    def prepare(self, rows: int, width: int, max_new_tokens: int, rule: SamplingRule) -> None:
        """Allocate the cache and capture every graph a call of this shape needs (what the first
        call of a shape pays; the benchmark times it on its own). Whoever calls, the step is
        captured without autograd (a graph recorded with it would keep every step's activations)
        and with the decode's attention kernels."""
        with torch.inference_mode(), attention_kernels(self.device):
            self._prepare(rows, width, max_new_tokens, rule)

    def _prepare(self, rows: int, width: int, max_new_tokens: int, rule: SamplingRule) -> None:
        self._ensure_capacity(rows, width + max_new_tokens)
        if not self.use_graphs:
            return
        bucket = batch_bucket(rows)
        started = time.perf_counter()
        captured = 0
        for length in sorted({self._length_at(width, s) for s in range(max_new_tokens)}):
            key = (bucket, length, rule)
            if key not in self._graphs:
                self._graphs[key] = self._capture(bucket, length, rule)
                captured += 1
        if captured:
            torch.cuda.synchronize(self.device)
            self.stats.captures += captured
            self.stats.capture_s += time.perf_counter() - started

    def _length_at(self, width: int, step: int) -> int:
        """The length bucket of step `step`: its token is written at `width + step` and attends to everything before."""
        return min(length_bucket(width + step + 1), self._cache.length)

    # -- a call -----------------------------------------------------------------------------
    def decode(
        self,
        prefill,
        rows_prompt: torch.Tensor,
        attention: torch.Tensor,
        next_positions: torch.Tensor,
        uniforms: torch.Tensor | None,
        max_new_tokens: int,
        rule: SamplingRule,
    ):
        """Decode every row from a prefill (`sampling._prefill`): `rows_prompt[r]` is row r's prompt,
        `attention` / `next_positions` the prompts' mask `[prompts, width]` and next rotary position
        `[prompts]`, `uniforms` `[rows, max_new_tokens]` float64 (None when greedy). Returns
        `(tokens, logps, alive)`, each `[rows, steps]`, on the device."""
        with torch.inference_mode(), attention_kernels(self.device):
            return self._decode(prefill, rows_prompt, attention, next_positions, uniforms, max_new_tokens, rule)

    def _decode(self, prefill, rows_prompt, attention, next_positions, uniforms, max_new_tokens, rule):
        rows, width = len(rows_prompt), attention.shape[1]
        self._prepare(rows, width, max_new_tokens, rule)
        bucket = batch_bucket(rows) if self.use_graphs else rows
        cache = self._cache
        cache.fill_prefix(prefill.past_key_values, rows_prompt)
        self.key_bias.fill_(float("-inf"))
        self.key_bias[:rows, :width].masked_fill_(attention.index_select(0, rows_prompt).bool(), 0.0)
        self.key_bias[rows:bucket, 0] = 0.0  # padding rows attend to something (no NaN), record nothing
        self.positions[:rows].copy_(next_positions.index_select(0, rows_prompt))
        self.logits[:rows].copy_(prefill.logits[:, -1, :].float().index_select(0, rows_prompt))
        if uniforms is not None:
            self.uniforms[:rows, :max_new_tokens].copy_(uniforms)
        self.done.fill_(True)
        self.done[:rows] = False
        self.out_alive.zero_()
        self.write_at.fill_(width)
        self.step.zero_()
        steps = 0
        for step in range(max_new_tokens):
            if self.use_graphs:
                self._graphs[(bucket, self._length_at(width, step), rule)].replay()
            else:
                self._sample_step(bucket, self._length_at(width, step), rule)
            steps += 1
            if steps % STOP_CHECK_EVERY == 0 and rule.stop and bool(self.done[:rows].all()):
                break
        self.stats.calls += 1
        self.stats.steps += steps
        return self.out_tokens[:rows, :steps], self.out_logps[:rows, :steps], self.out_alive[:rows, :steps]


def pick_tokens(
    kernels: DecodeKernels,
    logits: torch.Tensor,
    uniforms: torch.Tensor | None,
    banned: torch.Tensor,
    rule: SamplingRule,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's next token from its logits `[rows, vocab]` (float32) and its pi_old (log-softmax
    of logits / T over the whole vocabulary): `sampling._decode`'s pick on the device. The filtered
    distribution comes from `kernels.filtered_probs` (fused where compiled); the inverse-CDF lookup
    of each row's uniform (`[rows, 1]` float64) over the vocabulary in token order stays eager:
    Inductor cannot generate a float64 scan this long (CUDA, torch 2.11)."""
    probs, lse = kernels.filtered_probs(logits, banned, rule)
    chosen = probs.argmax(-1) if rule.greedy else inverse_cdf(probs, uniforms)
    logp = logits.gather(-1, chosen[:, None])[:, 0] / (rule.temperature if not rule.greedy else 1.0) - lse
    return chosen, logp


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Each row's token `[rows]` from its filtered distribution `[rows, vocab]` and uniform `[rows, 1]`:
    the first token, in token order, whose cumulative mass (float64) reaches u x the row's total, so a
    filtered (zero-mass) token never wins. The eager and the static sampler's draw."""
    cdf = probs.double().cumsum(-1)
    return torch.searchsorted(cdf, uniforms * cdf[:, -1:]).clamp(max=cdf.shape[-1] - 1)[:, 0]


def sampling_rule(backend, cfg, vocab: int) -> SamplingRule:
    """The rule a call's `SamplingConfig` bakes into a graph."""
    return SamplingRule(
        temperature=float(cfg.temperature) if cfg.temperature > 0 else 0.0,
        top_k=candidate_count(cfg.top_k, vocab),
        top_p=float(cfg.top_p) if cfg.temperature > 0 else 1.0,
        banned=tuple(backend.banned_ids(cfg)),
        stop=tuple(sorted(backend.stop_ids)) if not cfg.ignore_eos else (),
        pad=int(backend.tokenizer.pad_token_id),
    )
