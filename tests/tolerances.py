"""Tolerances derived from floating-point arithmetic, never tuned to one run.

Model: Higham & Mary, "A New Approach to Probabilistic Rounding Error Analysis", SIAM J. Sci.
Comput. 41(5), A2815-A2835 (2019). A result that picks up n roundings on its way, each a factor
(1 + delta_i) with |delta_i| <= u, independent and of mean zero, has a relative error of at most

    gamma(n) = exp(lam * sqrt(n) * u + n * u**2 / (1 - u)) - 1  ~  lam * sqrt(n) * u

with probability at least 1 - 2 exp(-lam**2 (1 - u)**2 / 2) (their Theorem 2.4), relative to the
magnitudes of what was accumulated (for an inner product, sum_i |a_i b_i|: Theorem 3.1). The
worst case (Wilkinson's gamma_n = n u / (1 - n u)) is reached only by rounding errors that all go
one way; the probabilistic sqrt(n) is what fp32 kernels show, in any summation order, so it holds
for two implementations (torch and mlx, two kernels, CPU and GPU) alike. Each lies within the
bound of the exact value, so they lie within twice the bound of each other (`implementations=2`).

LAMBDA = 5: one bound fails with probability 2 exp(-12.5) = 7.5e-6. For fewer than lambda^2 = 25
roundings the worst case n u is the smaller bound, and holds always (`gamma` takes the smaller).
(Measured on tiny-local, torch against mlx, the largest per-token gap is ~0.2 sqrt(k) u |magnitude|,
1-2% of the two-implementation bound; a real bug -- a dropped or shifted token, a wrong
temperature, an adapter not applied, a 1% scale error -- moves some log-prob by 1e-2 or more, far
beyond it: `assert_logprobs_close` checks that a 1% error would show.)

A log-prob is log p(y) = z_y / T - logsumexp(z / T), the difference of two numbers of ~10-30 nats
for a model's logits z. Its error is that of those two numbers, not a fraction of |log p|: a
near-certain token (log p ~ -1e-3) carries the same ~1e-5 absolute error as any other. So

    |error of log p(y)| <= gamma(k) * (|z_y / T| + |logsumexp(z / T)|) + gamma(V)

where k counts the roundings on the longest path through the forward to one logit
(`forward_depth`) and gamma(V) is the relative error of the log-sum-exp's sum of V positive terms,
which is an absolute error after the log. A sum of log-probs (a sequence log-prob, a DPO margin)
is within the sum of its terms' bounds (triangle inequality): its tolerance is relative to the
summed magnitudes, and grows with the summed length, never a fixed absolute number.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

U32 = 2.0**-24  # unit roundoff of IEEE binary32 (round to nearest)
U64 = 2.0**-53  # binary64
U_BF16 = 2.0**-8  # bfloat16 (8 significand bits)
LAMBDA = 5.0


def gamma(n: float, u: float = U32, lam: float = LAMBDA) -> float:
    """The relative error after n roundings of unit roundoff u: Higham & Mary's gamma~_n(lambda),
    or the worst case gamma_n = n u / (1 - n u) where that is smaller (n < lambda^2: a few ops)."""
    n = max(float(n), 1.0)
    probabilistic = math.expm1(lam * math.sqrt(n) * u + n * u * u / (1.0 - u))
    return min(probabilistic, n * u / (1.0 - n * u)) if n * u < 1.0 else probabilistic


def _get(config: Any, name: str, default: Any = None) -> Any:
    return config.get(name, default) if isinstance(config, Mapping) else getattr(config, name, default)


def forward_depth(config: Any, seq_len: int) -> int:
    """Roundings on the longest path from the input to one logit of a Qwen3/Llama-style decoder
    (`config`: a Hugging Face config or its dict), for sequences of `seq_len` tokens. Per layer:
    RMSNorm's sum of squares (H), the q/k/v projections (H), Qwen3's q/k norms (d), a score (d), the
    softmax's normaliser and the weighted sum of values (S each), the output projection (heads * d),
    the residual add (1); RMSNorm (H), gate/up (H), down (I), the residual add (1). Then the final
    norm (H), the head (H), the temperature's division and the final subtraction (3). The
    vocabulary's log-sum-exp is `gamma(V)` apart (see the module docstring)."""
    h = int(_get(config, "hidden_size"))
    heads = int(_get(config, "num_attention_heads"))
    d = int(_get(config, "head_dim", None) or h // heads)
    layer = 4 * h + 2 * d + 2 * int(seq_len) + heads * d + int(_get(config, "intermediate_size")) + 2
    return int(_get(config, "num_hidden_layers")) * layer + 2 * h + 3


def logprob_bound(magnitude, depth: int, vocab: int, u: float = U32, implementations: int = 2) -> np.ndarray:
    """Per-token bound on |a - b| for log-probs computed by `implementations` fp32 implementations
    of a forward of `depth` roundings (2: two of them against each other; 1: one against an exact,
    e.g. float64, reference). `magnitude` = |z_y / T| + |logsumexp(z / T)| per token."""
    return implementations * (gamma(depth, u) * np.asarray(magnitude, dtype=np.float64) + gamma(vocab, u))


def _as_ids(backend, prompt) -> list[int]:
    return list(prompt) if prompt and isinstance(prompt[0], (int, np.integer)) else backend.prompt_ids(prompt)


def logprob_magnitudes(
    backend, prompts: Sequence, responses: Sequence[Sequence[int]], temperature: float = 1.0, use_adapter: bool = True
) -> list[np.ndarray]:
    """|z_y / T| + |logsumexp(z / T)| at every response token, from a `TorchBackend`'s own logits
    (float64 after the head): the two numbers each log-prob is the difference of. `prompts`:
    chat messages or token ids."""
    import contextlib

    import torch

    out: list[np.ndarray] = []
    ctx = contextlib.nullcontext() if use_adapter else backend.adapter_disabled()
    with torch.no_grad(), ctx:
        for start in range(0, len(responses), 16):  # right-padded batches, as the backends score
            p_ids = [_as_ids(backend, p) for p in prompts[start : start + 16]]
            r_ids = [[int(t) for t in r] for r in responses[start : start + 16]]
            if not any(r_ids):
                out += [np.zeros(0) for _ in r_ids]
                continue
            keep = [i for i, r in enumerate(r_ids) if r]
            hidden = backend.response_hidden([p_ids[i] for i in keep], [r_ids[i] for i in keep])
            z = backend.lm_head(hidden).double().cpu() / temperature
            targets = torch.tensor([t for i in keep for t in r_ids[i]])
            flat = (z[torch.arange(len(targets)), targets].abs() + torch.logsumexp(z, dim=-1).abs()).numpy()
            offsets = np.cumsum([0] + [len(r_ids[i]) for i in keep])
            pieces = {i: flat[offsets[j] : offsets[j + 1]] for j, i in enumerate(keep)}
            out += [pieces.get(i, np.zeros(0)) for i in range(len(r_ids))]
    return out


def model_config(backend) -> Any:
    """The Hugging Face config of a `TorchBackend` (under a PEFT wrapper too)."""
    return backend.model.config


def logprob_tolerances(
    backend,
    prompts: Sequence,
    responses: Sequence[Sequence[int]],
    temperature: float = 1.0,
    use_adapter: bool = True,
    implementations: int = 2,
) -> list[np.ndarray]:
    """Per-token tolerances for these responses' log-probs on `backend`'s model (a `TorchBackend`,
    whose logits give the magnitudes; the mlx model is the same weights): `logprob_bound` at the
    depth of the longest `prompt + response` here."""
    config = model_config(backend)
    depth, vocab = forward_depth(config, longest(backend, prompts, responses)), int(_get(config, "vocab_size"))
    return [
        logprob_bound(m, depth, vocab, implementations=implementations)
        for m in logprob_magnitudes(backend, prompts, responses, temperature, use_adapter)
    ]


def worst_ratio(got: Sequence, want: Sequence, tolerances: Sequence) -> float:
    """max |got - want| / tolerance over every token (<= 1: within the bound)."""
    assert [len(x) for x in got] == [len(y) for y in want] == [len(t) for t in tolerances]
    ratios = [
        np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)) / np.asarray(t)
        for a, b, t in zip(got, want, tolerances)
    ]
    return max((float(r.max()) for r in ratios if r.size), default=0.0)


def assert_logprobs_close(got: Sequence, want: Sequence, tolerances: Sequence) -> None:
    """Every token's |got - want| within its tolerance, and the bound is one a real bug breaks:
    the same values scaled by 1.01 (a 1% error) fall outside it."""
    ratio = worst_ratio(got, want, tolerances)
    assert ratio <= 1.0, f"a log-prob differs by {ratio:.2f}x its rounding bound"
    scaled = [1.01 * np.asarray(a, np.float64) for a in got]
    assert worst_ratio(scaled, want, tolerances) > 1.0, "the bound is too loose to see a 1% error"


def margin_tolerances(
    backend, prompts: Sequence, candidates: Sequence[str], unit: str, implementations: int = 2
) -> np.ndarray:
    """Tolerance of each `score_candidates` margin (outcome_flywheel/preferences/style_match.py):
    margin = [sum log pi - sum log ref](candidate) - [sum log pi - sum log ref](hold), four sums
    of per-token log-probs over the candidate's and the hold text's segments, so its bound is the
    sum of those tokens' bounds, adapter on and off: relative to the summed magnitudes. (The scorer
    adds the fp32 log-probs in float64: n 2^-53 of their sum, nothing next to these.)"""
    from outcome_flywheel.models.segments import encode_segments, flatten_segments
    from outcome_flywheel.preferences.weighting import HOLD_TEXT

    prompts = list(prompts)
    texts = list(candidates) + [HOLD_TEXT] * len(prompts)
    segments = [encode_segments(backend.encode_response, text, unit) for text in texts]
    flat_prompts, flat_responses, owner = flatten_segments(prompts + prompts, segments)
    per_item = np.zeros(len(texts))
    for use_adapter in (True, False):
        tols = logprob_tolerances(
            backend, flat_prompts, flat_responses, use_adapter=use_adapter, implementations=implementations
        )
        per_item += np.bincount(
            np.asarray(owner, dtype=int), weights=[float(t.sum()) for t in tols], minlength=len(texts)
        )
    n = len(prompts)
    return per_item[:n] + per_item[n:]


def kl_tolerances(
    backend,
    prompts: Sequence,
    responses: Sequence[Sequence[int]],
    temperature: float = 1.0,
    reference=None,
    implementations: int = 2,
) -> list[np.ndarray]:
    """Per-token tolerances of the exact KL(p || q) at every response position (`token_kl`),
    p = `backend` (a `TorchBackend`; its adapter on), q = `reference` or `backend` with its adapter
    off: `kl_bound` on their logits, at the forward's depth."""
    import contextlib

    import torch

    config = model_config(backend)
    depth = forward_depth(config, longest(backend, prompts, responses))
    ref = reference or backend
    out = []
    with torch.no_grad():
        for prompt, response in zip(prompts, responses):
            response = [int(t) for t in response]
            ids = _as_ids(backend, prompt)
            zp = backend.lm_head(backend.response_hidden([ids], [response])).double().cpu() / temperature
            with backend.adapter_disabled() if reference is None else contextlib.nullcontext():
                zq = ref.lm_head(ref.response_hidden([ids], [response])).double().cpu() / temperature
            out.append(kl_bound(zp, zq, depth, implementations))
    return out


def kl_bound(zp, zq, depth: int, implementations: int = 2) -> np.ndarray:
    """Per-row bound on the error of KL(p || q) = sum_v p_v (lp_v - lq_v) computed in fp32 from
    logits `zp`, `zq` `[N, V]` (already divided by the temperature; given here in float64) that
    themselves come out of `depth` roundings. To first order in the logits' errors (dz^p, dz^q),

        dKL = sum_v p_v (d_v - KL) dz^p_v + sum_v (q_v - p_v) dz^q_v,      d_v = lp_v - lq_v,

    (the gradient of the KL in each model's logits), with every |dz_v| <= gamma(depth) (max_v |z_v|
    + |lse|) (module docstring); plus what rounds after the logits, which does not cancel when
    p = q: each log-sum-exp (gamma(V), and u |lse| for adding its maximum back) and the sum over
    the vocabulary, gamma(V) sum_v p_v (|lp_v| + |lq_v|) (it may be taken as sum p lp - sum p lq).
    So the error scales with how far apart p and q are, down to that floor."""
    import torch

    zp, zq = torch.as_tensor(np.asarray(zp, np.float64)), torch.as_tensor(np.asarray(zq, np.float64))
    g_k, g_v = gamma(depth), gamma(zp.shape[-1])
    lp, lq = torch.log_softmax(zp, -1), torch.log_softmax(zq, -1)
    p, q, d = lp.exp(), lq.exp(), lp - lq
    kl = (p * d).sum(-1, keepdim=True)
    lse_p, lse_q = torch.logsumexp(zp, -1).abs(), torch.logsumexp(zq, -1).abs()
    scale_p, scale_q = zp.abs().amax(-1) + lse_p, zq.abs().amax(-1) + lse_q
    first_order = g_k * (scale_p * (p * (d - kl).abs()).sum(-1) + scale_q * (q - p).abs().sum(-1))
    sums = g_v * (2.0 + (p * (lp.abs() + lq.abs())).sum(-1)) + 2 * U32 * (lse_p + lse_q)
    return (implementations * (first_order + sums)).numpy()


def logprob_bound_from_logits(z, targets, depth: int, implementations: int = 2) -> np.ndarray:
    """`logprob_bound` for the log-probs of `targets` `[N]` under logits `z` `[N, V]` (divided by
    the temperature; float64 here) that come out of `depth` roundings."""
    z = np.asarray(z, np.float64)
    top = z.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(z - top).sum(-1, keepdims=True)))[:, 0]
    magnitude = np.abs(z[np.arange(len(z)), np.asarray(targets)]) + np.abs(lse)
    return logprob_bound(magnitude, depth, z.shape[-1], implementations=implementations)


def logprob_gradient_scales(
    backend, prompts: Sequence, responses: Sequence[Sequence[int]], temperature: float = 1.0
) -> tuple[list[float], list[float]]:
    """For gradients in the trainable parameters theta of a `TorchBackend`, per response:
    (||grad sum_t (z_y + E_p[z])_t||, ||grad sum_t log p_t||). grad log p_t = J_t^T (e_y - p_t) is
    a difference, as the log-prob is of z_y and lse; the first norm takes the cotangent's two parts
    with one sign, e_y + p_t, so a near-certain token (whose gradient cancels to ~0) still counts
    with the size of what was accumulated: the magnitude the backward's rounding is relative to.
    (Cancellation inside J across tokens is not undone: a per-token backward would be, at ~2
    backward passes per token.) One implementation's error in grad sum_t log p_t is then at most
    `gradient_bound` times the first."""
    import torch

    params = backend.trainable_parameters()
    magnitudes, norms = [], []
    for prompt, response in zip(prompts, responses):
        response = [int(t) for t in response]
        rows, targets = torch.arange(len(response)), torch.tensor(response)
        z = backend.lm_head(backend.response_hidden([_as_ids(backend, prompt)], [response])).float() / temperature
        p = torch.softmax(z.detach(), -1)
        positive = (z[rows, targets] + (p * z).sum(-1)).sum()
        logp = torch.log_softmax(z, -1)[rows, targets].sum()
        grads = torch.autograd.grad(
            torch.stack([positive, logp]), params, torch.eye(2), is_grads_batched=True, allow_unused=True
        )
        sq = sum((g.double() ** 2).flatten(1).sum(-1) for g in grads if g is not None).sqrt().numpy()
        magnitudes.append(float(sq[0]))
        norms.append(float(sq[1]))
    return magnitudes, norms


def _norm(grads) -> float:
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads if g is not None))


def gradient_bound(backend, seq_len: int, implementations: int = 2) -> float:
    """gamma(k + V) per implementation: a backward pass has the forward's depth and the softmax's
    sum over V; the relative error of a log-prob gradient against `logprob_gradient_scales`'s scale."""
    config = model_config(backend)
    return implementations * gamma(forward_depth(config, seq_len) + int(_get(config, "vocab_size")))


def longest(backend, prompts: Sequence, responses: Sequence[Sequence[int]]) -> int:
    """The longest `prompt + response` in tokens (the attention's accumulation length)."""
    return max((len(_as_ids(backend, p)) + len(r) for p, r in zip(prompts, responses)), default=1)


def dpo_margin_bounds(
    backend, pairs: Sequence, unit: str = "line", implementations: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    """(margins, their tolerances) of weighted DPO's pairs on a `TorchBackend` (its adapter the
    policy, adapter off the reference): m_i = (pi_c - ref_c) - (pi_r - ref_r), four sums of
    log-probs over the completions' segments, each within the sum of its tokens' bounds plus the
    fp32 sum's own 2 gamma(T) sum |logp|."""
    from outcome_flywheel.models.segments import encode_segments, flatten_segments

    prompts = [x.prompt for x in pairs]
    segments = [encode_segments(backend.encode_response, x.chosen, unit) for x in pairs]
    segments += [encode_segments(backend.encode_response, x.rejected, unit) for x in pairs]
    rows_p, rows_r, item = flatten_segments(prompts + prompts, segments)
    n, item = len(pairs), np.asarray(item)
    sign, owner = np.where(item < n, 1.0, -1.0), item % n  # a pair's chosen rows add, its rejected ones subtract
    sums, bounds = np.zeros(len(rows_r)), np.zeros(len(rows_r))
    for use_adapter, direction in ((True, 1.0), (False, -1.0)):
        logps = backend.response_logprobs(rows_p, rows_r, use_adapter=use_adapter)
        tols = logprob_tolerances(backend, rows_p, rows_r, use_adapter=use_adapter, implementations=implementations)
        sums += [direction * float(np.sum(lp, dtype=np.float64)) for lp in logps]
        bounds += [
            float(t.sum()) + implementations * gamma(len(lp)) * float(np.abs(lp).sum()) for t, lp in zip(tols, logps)
        ]
    return np.bincount(owner, weights=sign * sums, minlength=n), np.bincount(owner, weights=bounds, minlength=n)


def dpo_loss_tolerance(
    backend, pairs: Sequence, beta: float, unit: str = "line", implementations: int = 2, margins: tuple | None = None
) -> float:
    """Tolerance of the weighted DPO loss sum_i (w_i / W) -log sigmoid(beta m_i) of `pairs` (one
    batch): -log sigmoid(beta m) is beta sigmoid(-beta m)-Lipschitz in m, so the loss moves by at
    most sum_i (w_i / W) beta sigmoid(-beta m_i) dm_i (`dpo_margin_bounds`), plus the fp32
    arithmetic of the loss itself, gamma(n + 4) of what it adds up. (`margins`: `dpo_margin_bounds`'s,
    when already at hand.)"""
    margin, dm = margins or dpo_margin_bounds(backend, pairs, unit, implementations)
    w = np.array([float(x.weight) for x in pairs])
    w = w / w.sum()
    per_pair = np.logaddexp(0.0, -beta * margin)
    arithmetic = implementations * gamma(len(pairs) + 4) * float((w * (per_pair + beta * np.abs(margin))).sum())
    return float((w * beta / (1.0 + np.exp(beta * margin)) * dm).sum()) + arithmetic
