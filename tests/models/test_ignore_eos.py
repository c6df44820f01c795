"""`ignore_eos` (vLLM's extension): nothing stops a row, so a reply that runs to its budget is cut by length,
even where its last token is a stop id (`Sample.finished` False, the service's finish_reason "length"). Made
certain here by counting every token as a stop id: without `ignore_eos` each row ends at its first token."""

from __future__ import annotations

import pytest

from outcome_flywheel.models.interface import SamplingConfig

MESSAGES = [{"role": "user", "content": "Chips rally after earnings."}]


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_a_row_run_to_its_budget_under_ignore_eos_is_not_finished(tiny_model_dir, framework):
    if framework == "mlx":
        pytest.importorskip("mlx.core")
        from outcome_flywheel.models.mlx.backend import MLXBackend

        policy = MLXBackend(tiny_model_dir)
    else:
        from outcome_flywheel.models.torch.backend import TorchBackend

        policy = TorchBackend(tiny_model_dir, device="cpu")
    policy.stop_ids = set(range(len(policy.tokenizer)))  # whatever a row draws is a stop id
    to_budget = policy.sample([MESSAGES], 2, SamplingConfig(temperature=0.8, max_new_tokens=5, ignore_eos=True), [0])
    assert [(len(s.token_ids), s.finished) for s in to_budget[0]] == [(5, False), (5, False)]
    stopped = policy.sample([MESSAGES], 2, SamplingConfig(temperature=0.8, max_new_tokens=5), [0])
    assert [(len(s.token_ids), s.finished) for s in stopped[0]] == [(1, True), (1, True)]
