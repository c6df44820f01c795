"""MLX backend against the torch backend on the same tiny-local weights: prompt ids, teacher-
forced log-probs, the raw-distribution convention of sampled log-probs, seeded sampling."""

from __future__ import annotations

import numpy as np
import pytest

from tests.mlx_fixtures import PROMPTS, RESPONSES, max_abs_diff, require_mlx
from tests.tolerances import assert_logprobs_close, logprob_tolerances, worst_ratio

require_mlx()

from outcome_flywheel.models.interface import SamplingConfig  # noqa: E402
from outcome_flywheel.models.mlx.backend import MLXBackend  # noqa: E402
from outcome_flywheel.models.mlx.sampling import filter_logits  # noqa: E402
from outcome_flywheel.models.torch.backend import TorchBackend  # noqa: E402


@pytest.fixture(scope="module")
def mlx_policy(tiny_model_dir):
    return MLXBackend(tiny_model_dir)


@pytest.fixture(scope="module")
def torch_base(tiny_model_dir):
    return TorchBackend(tiny_model_dir, device="cpu")


@pytest.fixture(scope="module")
def mlx_samples(mlx_policy):
    cfg = SamplingConfig(temperature=0.9, top_p=0.95, top_k=50, max_new_tokens=48)
    return mlx_policy.sample(PROMPTS, 3, cfg, seeds=[11, 12, 13])


def test_loads_tiny_local_in_float32_with_the_same_parameter_count(mlx_policy, torch_base):
    import mlx.core as mx

    assert mlx_policy.dtype == mx.float32
    assert mlx_policy.num_parameters() == torch_base.num_parameters()
    assert not mlx_policy.has_adapter


def test_prompt_and_response_ids_match_torch(mlx_policy, torch_base):
    for p in PROMPTS:
        assert mlx_policy.prompt_ids(p) == torch_base.prompt_ids(p)
    for r in RESPONSES:
        ids = mlx_policy.encode_response(r)
        assert ids == torch_base.encode_response(r)
        assert mlx_policy.decode(ids) == torch_base.decode(ids)
    assert mlx_policy.stop_ids == torch_base.stop_ids


def test_teacher_forced_logprobs_match_torch(mlx_policy, torch_base, mlx_samples):
    # Responses of different lengths in one batch (right padding), written and sampled ones.
    responses = [mlx_policy.encode_response(r) for r in RESPONSES]
    responses += [s.token_ids for group in mlx_samples for s in group]
    prompts = PROMPTS + [p for p in PROMPTS for _ in range(3)]
    lp_mlx = mlx_policy.response_logprobs(prompts, responses)
    lp_torch = torch_base.response_logprobs(prompts, responses)
    assert [len(x) for x in lp_mlx] == [len(r) for r in responses]
    # Two fp32 forwards: per token within the rounding bound of tests/tolerances.py (was a flat 1e-4).
    assert_logprobs_close(lp_mlx, lp_torch, logprob_tolerances(torch_base, prompts, responses))
    # Without an adapter the base view is the same policy.
    assert max_abs_diff(mlx_policy.response_logprobs(prompts[:3], responses[:3], use_adapter=False), lp_mlx[:3]) == 0.0


def test_sampled_logprobs_are_at_the_sampling_temperature(mlx_policy, torch_base, mlx_samples):
    """Stored log-probs (temperature 0.9, top-p, top-k while sampling) equal teacher forcing at
    temperature 0.9, before the filter: GSPO's pi_old, in mlx and in torch."""
    samples = [s for group in mlx_samples for s in group]
    prompts = [p for p in PROMPTS for _ in range(3)]
    ids = [s.token_ids for s in samples]
    stored = [np.array(s.logprobs) for s in samples]
    assert all(len(s.logprobs) == len(s.token_ids) > 0 for s in samples)
    # The sampler's cached decode and teacher forcing are two fp32 computations (in mlx, and mlx
    # against torch): per token within the rounding bound (tests/tolerances.py; was a flat 1e-4).
    tolerances = logprob_tolerances(torch_base, prompts, ids, temperature=0.9)
    assert_logprobs_close(stored, mlx_policy.response_logprobs(prompts, ids, temperature=0.9), tolerances)
    assert_logprobs_close(stored, torch_base.response_logprobs(prompts, ids, temperature=0.9), tolerances)
    assert worst_ratio(stored, mlx_policy.response_logprobs(prompts, ids), tolerances) > 1.0  # not temperature 1
    for s in samples:
        assert s.finished == (s.token_ids[-1] in mlx_policy.stop_ids)
        assert s.text == mlx_policy.decode(s.token_ids)


def test_sampling_is_reproducible_per_prompt_seed(mlx_policy, mlx_samples):
    cfg = SamplingConfig(temperature=0.9, top_p=0.95, top_k=50, max_new_tokens=48)
    again = mlx_policy.sample(PROMPTS, 3, cfg, seeds=[11, 12, 13])
    assert [[s.token_ids for s in g] for g in again] == [[s.token_ids for s in g] for g in mlx_samples]
    # A prompt's samples depend on its own seed, not on the batch around it.
    alone = mlx_policy.sample([PROMPTS[2]], 3, cfg, seeds=[13])
    assert [s.token_ids for s in alone[0]] == [s.token_ids for s in mlx_samples[2]]
    # The n samples of one prompt differ from each other, and another seed gives other samples.
    assert len({tuple(s.token_ids) for s in mlx_samples[0]}) > 1
    other = mlx_policy.sample([PROMPTS[0]], 3, cfg, seeds=[99])
    assert [s.token_ids for s in other[0]] != [s.token_ids for s in mlx_samples[0]]


def test_greedy_matches_torch_and_top_k_1(mlx_policy, torch_base):
    greedy = mlx_policy.greedy(PROMPTS, max_new_tokens=24)
    assert greedy == torch_base.greedy(PROMPTS, max_new_tokens=24)
    top1 = mlx_policy.sample(PROMPTS, 2, SamplingConfig(temperature=1.0, top_k=1, max_new_tokens=24), seeds=[1, 2, 3])
    assert [[s.text for s in g] for g in top1] == [[t, t] for t in greedy]


def test_max_new_tokens_caps_unfinished_samples(mlx_policy):
    out = mlx_policy.sample(PROMPTS[:1], 2, SamplingConfig(max_new_tokens=3), seeds=[5])
    for s in out[0]:
        assert len(s.token_ids) <= 3
        assert s.finished == (s.token_ids[-1] in mlx_policy.stop_ids)


def _rule_cases():
    rng = np.random.default_rng(0)
    random_logits = rng.normal(size=(4, 50)).astype(np.float32) * 3
    cases = [
        (random_logits, k, p) for k, p in [(0, 1.0), (5, 1.0), (0, 0.8), (10, 0.5), (50, 0.999), (3, 1e-6), (0, 0.999)]
    ]
    # Mass before a token exactly on the threshold: 0.5 + 0.25 = 0.75, so both 0.125s go.
    cases.append((np.log(np.array([[0.5, 0.25, 0.125, 0.125]], dtype=np.float32)), 0, 0.75))
    # Ties straddling the threshold: an order-dependent rule keeps one 0.3 and drops the other.
    cases.append((np.log(np.array([[0.3, 0.4, 0.3]], dtype=np.float32)), 0, 0.5))
    cases.append((np.log(np.array([[0.1, 0.3, 0.3, 0.3]], dtype=np.float32)), 2, 0.95))  # tie at the k-th value
    # Many near-equal small masses summing to about top_p, where float32 summation order matters.
    near = np.full((2, 2000), 0.0, dtype=np.float32)
    near[:, 0] = 2.0
    near[1] += rng.normal(scale=1e-4, size=2000).astype(np.float32)
    cases += [(near, 0, 0.6), (near, 1500, 0.9)]
    return cases


def test_filter_logits_follow_one_rule_in_both_backends():
    """mlx and torch keep exactly the tokens of the rule in `sampling.py`, checked against a
    token-by-token brute force (which fails when either rule differs), on threshold and tie cases."""
    import mlx.core as mx
    import torch

    from outcome_flywheel.models.sampling import reference_keep_mask
    from outcome_flywheel.models.torch.sampling import filter_logits as torch_filter_logits

    for logits, top_k, top_p in _rule_cases():
        expected = reference_keep_mask(logits, top_k, top_p)
        ours = np.array(filter_logits(mx.array(logits), top_k, top_p))
        theirs = torch_filter_logits(torch.tensor(logits), top_k, top_p).numpy()
        assert np.array_equal(~np.isinf(ours), expected), (top_k, top_p)
        assert np.array_equal(~np.isinf(theirs), expected), (top_k, top_p)
        assert np.array_equal(ours[expected], logits[expected]) and np.array_equal(theirs[expected], logits[expected])
    # the hand-computed cases, stated plainly
    assert reference_keep_mask(np.log([[0.5, 0.25, 0.125, 0.125]]), 0, 0.75).tolist() == [[True, True, False, False]]
    assert reference_keep_mask(np.log([[0.3, 0.4, 0.3]]), 0, 0.5).tolist() == [[True, True, True]]
