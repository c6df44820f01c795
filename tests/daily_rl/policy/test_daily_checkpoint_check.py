"""The `generated_by_own_checkpoint` check compares stored behaviour log-probs with the weights on disk."""

import json

import pandas as pd

from outcome_flywheel.daily_rl.policy.verify import behavior_logprob_gap
from outcome_flywheel.models.interface import LoraSettings, SamplingConfig
from outcome_flywheel.models.prompts import trading_note_messages
from tests.tolerances import logprob_tolerances


def test_gap_is_zero_for_the_sampling_policy_and_large_for_other_weights(torch_policy, model_backend):
    prompt = trading_note_messages("Nvidia beats estimates", "Revenue rose.")
    samples = torch_policy.sample([prompt], 4, SamplingConfig(max_new_tokens=32), seeds=[3])[0]
    rollouts = pd.DataFrame(
        {
            "prompt": [json.dumps(prompt)] * 4,
            "response_ids": [s.token_ids for s in samples],
            "behavior_logprobs": [s.logprobs for s in samples],
            "temperature": [SamplingConfig().temperature] * 4,  # stored at the sampling temperature
        }
    )
    # The gap is the largest per-rollout mean |stored - teacher forced|: the sampler's cached decode
    # and teacher forcing are two fp32 computations, so it is within the largest per-rollout mean of
    # the tokens' rounding bounds (tests/tolerances.py; ~1e-3, was a flat 1e-4).
    bounds = logprob_tolerances(
        torch_policy, [prompt] * 4, [s.token_ids for s in samples], temperature=SamplingConfig().temperature
    )
    bound = max(float(b.mean()) for b in bounds)
    assert behavior_logprob_gap(torch_policy, rollouts) <= bound

    other = model_backend.load()
    other.add_lora(LoraSettings(r=4, alpha=8))
    for name, p in other.model.named_parameters():
        if "lora_B" in name:
            p.data.fill_(0.05)  # different weights than the ones that sampled
    assert behavior_logprob_gap(other, rollouts) > max(1e-2, bound)


def test_a_checkpoint_counts_only_once_its_checks_pass(torch_policy, tmp_path):
    import pytest

    from outcome_flywheel.daily_rl.policy.checkpoints import (
        UnverifiedCheckpoint,
        mark_verified,
        parent_checkpoint,
        publish_checkpoint,
    )

    root = tmp_path / "policy"
    publish_checkpoint(torch_policy, root, "2025-11-03", {"date": "2025-11-03"}, is_base=True)
    mark_verified(root, "2025-11-03")
    info = publish_checkpoint(torch_policy, root, "2025-11-04", {"date": "2025-11-04"}, is_base=False)
    assert info["verified"] is False
    assert (root / "latest").resolve().name == "2025-11-03"  # not moved before the checks pass
    with pytest.raises(UnverifiedCheckpoint, match="re-run 2025-11-04"):
        parent_checkpoint(root, "2025-11-05")
    assert parent_checkpoint(root, "2025-11-04")[0].name == "2025-11-03"  # re-running the failed day is allowed
    mark_verified(root, "2025-11-04")
    assert (root / "latest").resolve().name == "2025-11-04"
    folder, parent = parent_checkpoint(root, "2025-11-05")
    assert folder.name == "2025-11-04" and parent["verified"] is True and parent["kind"] == "full"
