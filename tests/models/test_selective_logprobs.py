"""Selective log-probs at Qwen3's vocabulary (151,936): the chosen logit minus a chunked
logsumexp, with checkpointed chunks, equals the textbook full log-softmax, in values and in
gradients, in torch and in mlx; and so do the backends' teacher forcing and exact KL. Every
comparison is within the fp32 rounding bound of its computation (tests/tolerances.py): at this
vocabulary the log-sum-exp's sum of 151,936 terms alone may err by gamma(V) ~ 1.2e-4 relative
in any summation order (the flat 1e-5 these tests had held only for the summation orders of the
machine they were tuned on). A wrong index, temperature or chunk boundary is off by O(1)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from outcome_flywheel.models.provision.qwen3_shapes import QWEN3_VOCAB, build_model
from outcome_flywheel.models.torch import logprobs as tlp
from tests.tolerances import (
    forward_depth,
    gamma,
    gradient_bound,
    kl_bound,
    kl_tolerances,
    logprob_bound_from_logits,
    logprob_gradient_scales,
    logprob_tolerances,
    longest,
)


def _within(got, want, bound) -> None:
    got, want = (np.asarray(x.detach() if hasattr(x, "detach") else x, np.float64) for x in (got, want))
    ratio = float((np.abs(got - want) / np.asarray(bound)).max())
    assert ratio <= 1.0, f"off by {ratio:.2f}x the rounding bound"


def _head_grad_bounds(hidden, weight, targets, weights, temperature, implementations=2):
    """Elementwise bounds on the gradients of sum_t w_t log p(y_t) (logits = hidden @ W^T / T) in
    the hidden states and in W, from the magnitudes they are made of (float64): d/dh_t =
    w_t (W_y - sum_v p_v W_v) / T, d/dW_v = sum_t w_t (1[v = y_t] - p_tv) h_t / T, each within
    gamma(H + V + N + 4) of the same sums taken in absolute value."""
    h, w_mat = hidden.detach().double(), weight.detach().double()
    p = torch.softmax(h @ w_mat.T / temperature, -1)
    scale = weights.detach().double().abs()[:, None] / temperature
    onehot = torch.zeros_like(p)
    onehot[torch.arange(len(targets)), targets] = 1.0
    g = implementations * gamma(h.shape[1] + w_mat.shape[0] + h.shape[0] + 4)
    d_hidden = g * scale * (w_mat[targets].abs() + p @ w_mat.abs())
    d_weight = g * ((onehot + p) * scale).T @ h.abs()
    return d_hidden.numpy(), d_weight.numpy()


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """A Qwen3 with the real vocabulary and a tiny body, random weights, fp32."""
    return build_model(tmp_path_factory.mktemp("wide") / "model", "wide-vocab-toy", seed=3)


def _ids(rng, n, low=5):
    return [int(x) for x in rng.integers(low, QWEN3_VOCAB, size=n)]


def test_selective_log_softmax_equals_plain_at_qwen3_vocabulary():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 40, QWEN3_VOCAB, generator=gen) * 4
    index = torch.randint(QWEN3_VOCAB, (3, 40), generator=gen)
    for temperature in (1.0, 0.7):
        got = tlp.selective_log_softmax(logits, index, temperature)
        want = tlp.plain_token_logprobs(logits.double(), index, temperature)  # the plain computation, exactly
        # fp32 against exact: one implementation, the division by T and the final subtraction
        bound = logprob_bound_from_logits(
            logits.double().reshape(-1, QWEN3_VOCAB) / temperature, index.reshape(-1), 2, 1
        )
        _within(got.reshape(-1), want.reshape(-1), bound)


def test_chunked_checkpointed_logprobs_match_plain_in_values_and_gradients():
    torch.manual_seed(1)
    head = torch.nn.Linear(16, QWEN3_VOCAB, bias=False)
    hidden = torch.randn(45, 16, requires_grad=True)
    targets = torch.randint(QWEN3_VOCAB, (45,))
    weights = torch.randn(45)  # a loss that weighs tokens differently, as GSPO's does

    got = tlp.token_logprobs(hidden, head, targets, 0.8, chunk_elements=QWEN3_VOCAB * 10)  # 5 chunks
    (got * weights).sum().backward()
    got_grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    want = tlp.plain_token_logprobs(head(hidden).double(), targets, 0.8)
    (want * weights).sum().backward()
    # logits of depth 16 made per chunk or at once (two fp32 products), log-softmax in fp32 or exactly
    _within(got, want, logprob_bound_from_logits(head(hidden).double().detach() / 0.8, targets, 16 + 2))
    d_hidden, d_weight = _head_grad_bounds(hidden, head.weight, targets, weights, 0.8)
    _within(got_grads[0], hidden.grad, d_hidden)  # fp32 gradients from the fp64 path
    _within(got_grads[1], head.weight.grad, d_weight)


def test_chunking_covers_every_token_when_rows_do_not_divide():
    assert tlp.chunk_rows(QWEN3_VOCAB) == 2**25 // QWEN3_VOCAB
    head = torch.nn.Linear(4, 7, bias=False)
    hidden, targets = torch.randn(11, 4), torch.randint(7, (11,))
    got = tlp.token_logprobs(hidden, head, targets, chunk_elements=7 * 3)  # chunks of 3: 3+3+3+2
    assert got.shape == (11,)
    _within(
        got,
        tlp.plain_token_logprobs(head(hidden), targets),
        logprob_bound_from_logits(head(hidden).double().detach(), targets, 4 + 2),
    )


def _torch_plain(backend, prompts, responses, temperature):
    """Teacher forcing the textbook way: the model's full logits, a full log-softmax, gather."""
    out = []
    for p, r in zip(prompts, responses):
        ids = torch.tensor([list(p) + list(r)])
        logits = backend.model(input_ids=ids).logits[0, len(p) - 1 : len(p) - 1 + len(r)]
        out.append(tlp.plain_token_logprobs(logits, torch.tensor(r), temperature))
    return out


def test_torch_teacher_forcing_equals_plain_at_wide_vocabulary(wide_model):
    from outcome_flywheel.models.torch.backend import TorchBackend

    backend = TorchBackend(wide_model, device="cpu")
    rng = np.random.default_rng(0)
    prompts = [_ids(rng, 9), _ids(rng, 14), _ids(rng, 9)]
    responses = [_ids(rng, 30), _ids(rng, 7), _ids(rng, 22)]
    plain = _torch_plain(backend, prompts, responses, 0.8)
    bounds = logprob_tolerances(backend, prompts, responses, temperature=0.8)  # two fp32 forwards
    for shared in (False, True):
        logp, mask = backend.batch_logprobs(prompts, responses, temperature=0.8, shared_prefix=shared)
        for b, want in enumerate(plain):
            assert int(mask[b].sum()) == len(responses[b])
            _within(logp[b][mask[b]], want, bounds[b])
            assert float(logp[b][~mask[b]].detach().abs().sum()) == 0.0


@pytest.mark.parametrize("shared", [False, True])
def test_torch_teacher_forcing_gradients_equal_plain(wide_model, shared):
    """Shared: the first prompt runs once for two responses, which read it through
    `torch/prefix_cache.py` (its gradient is the sum over both)."""
    from outcome_flywheel.models.torch.backend import TorchBackend

    backend = TorchBackend(wide_model, device="cpu")
    rng = np.random.default_rng(1)
    first = _ids(rng, 6)
    prompts, responses = [first, _ids(rng, 11), first], [_ids(rng, 20), _ids(rng, 13), _ids(rng, 9)]
    params = [p for p in backend.model.parameters()]
    logp, mask = backend.batch_logprobs(prompts, responses, shared_prefix=shared)
    got = torch.autograd.grad(logp.sum(), params, allow_unused=True)
    want = torch.autograd.grad(
        sum(t.sum() for t in _torch_plain(backend, prompts, responses, 1.0)), params, allow_unused=True
    )
    # two fp32 backward passes: in norm within gamma(k + V) of each row's backward magnitude
    # (tests/tolerances.py, `logprob_gradient_scales`; was 1e-5 per entry)
    difference = sum(float(((g - w) ** 2).sum()) for g, w in zip(got, want) if w is not None) ** 0.5
    magnitudes, _ = logprob_gradient_scales(backend, prompts, responses)
    assert difference <= gradient_bound(backend, longest(backend, prompts, responses)) * sum(magnitudes)


def test_torch_token_kl_equals_plain(wide_model):
    from outcome_flywheel.models.torch.backend import TorchBackend

    policy = TorchBackend(wide_model, device="cpu")
    reference = TorchBackend(wide_model, device="cpu")
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    messages = [[{"role": "user", "content": "Oil rises"}], [{"role": "user", "content": "Chips fall on tariffs"}]]
    rng = np.random.default_rng(2)
    responses = [_ids(rng, 12), _ids(rng, 5)]
    got = policy.token_kl(messages, responses, temperature=0.9, reference=reference, chunk_elements=QWEN3_VOCAB * 4)
    bounds = kl_tolerances(policy, messages, responses, temperature=0.9, reference=reference)  # two fp32 forwards each
    for m, r, kl, bound in zip(messages, responses, got, bounds):
        p_ids = policy.prompt_ids(m)
        ids = torch.tensor([p_ids + r])
        with torch.no_grad():
            lp = policy.model(input_ids=ids).logits[0, len(p_ids) - 1 : len(p_ids) - 1 + len(r)]
            lq = reference.model(input_ids=ids).logits[0, len(p_ids) - 1 : len(p_ids) - 1 + len(r)]
        want = tlp.plain_token_kl(lp, lq, 0.9).numpy()
        _within(kl, want, bound)
        assert (want > 0).all()  # the perturbation moved the policy: the comparison is not of zeros


def test_mlx_selective_and_chunked_logprobs_equal_plain_with_gradients():
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed")
    import mlx.nn as nn

    from outcome_flywheel.models.mlx import logprobs as mlp

    key = mx.random.key(0)
    logits = mx.random.normal((2, 30, QWEN3_VOCAB), key=key) * 4
    index = mx.random.randint(0, QWEN3_VOCAB, (2, 30), key=mx.random.key(1))
    got = mlp.selective_log_softmax(logits, index, 0.7)
    flat = np.array(logits, dtype=np.float64).reshape(-1, QWEN3_VOCAB) / 0.7
    _within(
        np.array(got).reshape(-1),
        np.array(mlp.plain_token_logprobs(logits, index, 0.7)).reshape(-1),
        logprob_bound_from_logits(flat, np.array(index).reshape(-1), 2),
    )

    head = nn.Linear(16, QWEN3_VOCAB, bias=False)
    hidden = mx.random.normal((45, 16), key=mx.random.key(2))
    targets = mx.random.randint(0, QWEN3_VOCAB, (45,), key=mx.random.key(3))
    weights = mx.random.normal((45,), key=mx.random.key(4))

    def chunked(model, h):
        return (
            mlp.token_logprobs(h, model, targets, 0.8, chunk_elements=QWEN3_VOCAB * 10, module=model) * weights
        ).sum()

    def plain(model, h):
        return (mlp.plain_token_logprobs(model(h), targets, 0.8) * weights).sum()

    for fn in (chunked, plain):
        fn.value_and_grad = nn.value_and_grad(head, fn)
    got_value, got_grad = chunked.value_and_grad(head, hidden)
    want_value, want_grad = plain.value_and_grad(head, hidden)
    logits64 = np.array(head(hidden), dtype=np.float64) / 0.8
    per_token_bound = logprob_bound_from_logits(logits64, np.array(targets), 16 + 2)
    w64, lp64 = (
        np.abs(np.array(weights, dtype=np.float64)),
        np.array(mlp.plain_token_logprobs(head(hidden), targets, 0.8), np.float64),
    )
    # a sum of 45 weighted terms: their bounds, weighted, plus the fp32 sum's own (was 1e-3)
    assert abs(float(got_value) - float(want_value)) <= float(
        (w64 * per_token_bound).sum() + 2 * gamma(45) * (w64 * np.abs(lp64)).sum()
    )
    t_hidden, t_weight, t_targets = (torch.tensor(np.array(x)) for x in (hidden, head.weight, targets))
    _, d_weight = _head_grad_bounds(t_hidden, t_weight, t_targets, torch.tensor(np.array(weights)), 0.8)
    _within(np.array(got_grad["weight"]), np.array(want_grad["weight"]), d_weight)
    per_token = mlp.token_logprobs(hidden, head, targets, 0.8, chunk_elements=QWEN3_VOCAB * 10)
    _within(np.array(per_token), np.array(mlp.plain_token_logprobs(head(hidden), targets, 0.8)), per_token_bound)


def test_mlx_teacher_forcing_and_kl_equal_plain_at_wide_vocabulary(wide_model):
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed")
    from outcome_flywheel.models.mlx import logprobs as mlp
    from outcome_flywheel.models.mlx.backend import MLXBackend

    backend = MLXBackend(wide_model)
    rng = np.random.default_rng(0)
    prompts = [_ids(rng, 9), _ids(rng, 14)]
    responses = [_ids(rng, 25), _ids(rng, 7)]
    logp, mask = backend.batch_logprobs(prompts, responses, temperature=0.8)
    logp, mask = np.array(logp), np.array(mask)
    config = json.loads((wide_model / "config.json").read_text())
    depth = forward_depth(config, max(len(p) + len(r) for p, r in zip(prompts, responses)))
    for b, (p, r) in enumerate(zip(prompts, responses)):
        logits = backend.model(mx.array([list(p) + list(r)]))[0, len(p) - 1 : len(p) - 1 + len(r)]
        want = np.array(mlp.plain_token_logprobs(logits, mx.array(r), 0.8))
        # two fp32 forwards (batched and padded, or one sequence): the forward's rounding bound
        _within(logp[b][mask[b]], want, logprob_bound_from_logits(np.array(logits, dtype=np.float64) / 0.8, r, depth))
        assert not logp[b][~mask[b]].any()

    hidden = mx.random.normal((12, 64), key=mx.random.key(5))
    other = hidden + 0.3 * mx.random.normal((12, 64), key=mx.random.key(6))
    got = mlp.token_kl(hidden, backend.lm_head, other, backend.lm_head, 0.9, chunk_elements=QWEN3_VOCAB * 5)
    want = mlp.plain_token_kl(backend.lm_head(hidden), backend.lm_head(other), 0.9)
    # logits of depth 64 per chunk or at once, KL in fp32 either way: `kl_bound`
    zp, zq = (np.array(backend.lm_head(x), dtype=np.float64) / 0.9 for x in (hidden, other))
    _within(np.array(got), np.array(want), kl_bound(zp, zq, 64 + 2))
    assert float(mx.min(want)) > 0
