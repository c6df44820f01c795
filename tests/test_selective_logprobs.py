"""Selective log-probs at Qwen3's vocabulary (151,936): the chosen logit minus a chunked
logsumexp, with checkpointed chunks, equals the textbook full log-softmax within 1e-5, in values
and in gradients, in torch and in mlx; and so do the backends' teacher forcing and exact KL."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from outcome_flywheel.models.qwen3_shapes import QWEN3_VOCAB, build_model
from outcome_flywheel.models.torch import logprobs as tlp

TOL = 1e-5


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
        assert torch.max(torch.abs(got - want)).item() < TOL


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
    assert torch.max(torch.abs(got - want)).item() < TOL
    assert torch.max(torch.abs(got_grads[0] - hidden.grad)).item() < TOL  # fp32 gradients from the fp64 path
    assert torch.max(torch.abs(got_grads[1] - head.weight.grad)).item() < TOL


def test_chunking_covers_every_token_when_rows_do_not_divide():
    assert tlp.chunk_rows(QWEN3_VOCAB) == 2**25 // QWEN3_VOCAB
    head = torch.nn.Linear(4, 7, bias=False)
    hidden, targets = torch.randn(11, 4), torch.randint(7, (11,))
    got = tlp.token_logprobs(hidden, head, targets, chunk_elements=7 * 3)  # chunks of 3: 3+3+3+2
    assert got.shape == (11,)
    assert torch.allclose(got, tlp.plain_token_logprobs(head(hidden), targets), atol=TOL)


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
    for shared in (False, True):
        logp, mask = backend.batch_logprobs(prompts, responses, temperature=0.8, shared_prefix=shared)
        for b, want in enumerate(plain):
            assert int(mask[b].sum()) == len(responses[b])
            assert torch.max(torch.abs(logp[b][mask[b]] - want)).item() < TOL
            assert float(logp[b][~mask[b]].detach().abs().sum()) == 0.0


def test_torch_teacher_forcing_gradients_equal_plain(wide_model):
    from outcome_flywheel.models.torch.backend import TorchBackend

    backend = TorchBackend(wide_model, device="cpu")
    rng = np.random.default_rng(1)
    prompts, responses = [_ids(rng, 6), _ids(rng, 11)], [_ids(rng, 20), _ids(rng, 13)]
    params = [p for p in backend.model.parameters()]
    logp, mask = backend.batch_logprobs(prompts, responses)
    got = torch.autograd.grad(logp.sum(), params, allow_unused=True)
    want = torch.autograd.grad(sum(t.sum() for t in _torch_plain(backend, prompts, responses, 1.0)), params, allow_unused=True)
    for g, w in zip(got, want):
        if w is not None:
            assert torch.max(torch.abs(g - w)).item() < TOL


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
    for m, r, kl in zip(messages, responses, got):
        p_ids = policy.prompt_ids(m)
        ids = torch.tensor([p_ids + r])
        with torch.no_grad():
            lp = policy.model(input_ids=ids).logits[0, len(p_ids) - 1 : len(p_ids) - 1 + len(r)]
            lq = reference.model(input_ids=ids).logits[0, len(p_ids) - 1 : len(p_ids) - 1 + len(r)]
        want = tlp.plain_token_kl(lp, lq, 0.9).numpy()
        assert np.max(np.abs(kl - want)) < TOL
        assert (want > 0).all()  # the perturbation moved the policy: the comparison is not of zeros


def test_mlx_selective_and_chunked_logprobs_equal_plain_with_gradients():
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed")
    import mlx.nn as nn

    from outcome_flywheel.models.mlx import logprobs as mlp

    key = mx.random.key(0)
    logits = mx.random.normal((2, 30, QWEN3_VOCAB), key=key) * 4
    index = mx.random.randint(0, QWEN3_VOCAB, (2, 30), key=mx.random.key(1))
    got = mlp.selective_log_softmax(logits, index, 0.7)
    assert float(mx.max(mx.abs(got - mlp.plain_token_logprobs(logits, index, 0.7)))) < TOL

    head = nn.Linear(16, QWEN3_VOCAB, bias=False)
    hidden = mx.random.normal((45, 16), key=mx.random.key(2))
    targets = mx.random.randint(0, QWEN3_VOCAB, (45,), key=mx.random.key(3))
    weights = mx.random.normal((45,), key=mx.random.key(4))

    def chunked(model, h):
        return (mlp.token_logprobs(h, model, targets, 0.8, chunk_elements=QWEN3_VOCAB * 10, module=model) * weights).sum()

    def plain(model, h):
        return (mlp.plain_token_logprobs(model(h), targets, 0.8) * weights).sum()

    for fn in (chunked, plain):
        fn.value_and_grad = nn.value_and_grad(head, fn)
    got_value, got_grad = chunked.value_and_grad(head, hidden)
    want_value, want_grad = plain.value_and_grad(head, hidden)
    assert abs(float(got_value) - float(want_value)) < 1e-3  # a sum of 45 terms
    assert float(mx.max(mx.abs(got_grad["weight"] - want_grad["weight"]))) < TOL
    per_token = mlp.token_logprobs(hidden, head, targets, 0.8, chunk_elements=QWEN3_VOCAB * 10)
    assert float(mx.max(mx.abs(per_token - mlp.plain_token_logprobs(head(hidden), targets, 0.8)))) < TOL


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
    for b, (p, r) in enumerate(zip(prompts, responses)):
        logits = backend.model(mx.array([list(p) + list(r)]))[0, len(p) - 1 : len(p) - 1 + len(r)]
        want = np.array(mlp.plain_token_logprobs(logits, mx.array(r), 0.8))
        assert np.max(np.abs(logp[b][mask[b]] - want)) < TOL
        assert not logp[b][~mask[b]].any()

    hidden = mx.random.normal((12, 64), key=mx.random.key(5))
    other = hidden + 0.3 * mx.random.normal((12, 64), key=mx.random.key(6))
    got = mlp.token_kl(hidden, backend.lm_head, other, backend.lm_head, 0.9, chunk_elements=QWEN3_VOCAB * 5)
    want = mlp.plain_token_kl(backend.lm_head(hidden), backend.lm_head(other), 0.9)
    assert float(mx.max(mx.abs(got - want))) < TOL
    assert float(mx.min(want)) > 0
