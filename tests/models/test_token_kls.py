"""`ModelBackend.token_kls`: several exact KLs on the same responses, each model forwarded once a batch (the gate's
KL to the parent and the candidate's and parent's KLs to the base), in both frameworks: each pair's KL is the one
`token_kl` takes alone."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.train.test_exact_kl import NOTE, _backend


def _moved_less(tiny_model_dir, framework: str):
    """The same seeded adapter at half its B: a parent the candidate moved away from."""
    backend = _backend(tiny_model_dir, framework)
    if framework == "mlx":
        for _, module in backend.lora_modules():
            module.lora_b = module.lora_b * 0.5
    else:
        import torch

        with torch.no_grad():
            for name, weight in backend.model.named_parameters():
                if "lora_B" in name:
                    weight.mul_(0.5)
    return backend


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_each_pair_is_its_own_token_kl_from_one_forward_of_each_model(tiny_model_dir, framework, monkeypatch):
    from outcome_flywheel.models.prompts import trading_note_messages

    candidate, parent = _backend(tiny_model_dir, framework), _moved_less(tiny_model_dir, framework)
    ids = candidate.text_ids(NOTE)
    prompts = [trading_note_messages(h, "") for h in ("Meta beats estimates", "Boeing recalls jets", "Intel cuts")]
    responses = [ids, ids[:7], ids[3:]]
    alone = [
        candidate.token_kl(prompts, responses, 0.8, reference=parent, batch_size=2),
        candidate.token_kl(prompts, responses, 0.8, batch_size=2),
        parent.token_kl(prompts, responses, 0.8, batch_size=2),
    ]
    forwards = []
    own_forward = type(candidate).response_hidden
    monkeypatch.setattr(
        type(candidate), "response_hidden", lambda self, *a: forwards.append(1) or own_forward(self, *a)
    )
    together = candidate.token_kls(prompts, responses, [(candidate, parent), (candidate, None), (parent, None)], 0.8, 2)
    assert len(forwards) == 3 * 2  # candidate, parent and the base, once in each of the two batches
    assert all(k.mean() > 1e-3 for kls in alone for k in kls)  # moved adapters: KLs to see
    for got, expected in zip(together, alone):
        assert [len(k) for k in got] == [len(r) for r in responses]
        # the same float32 operations on the same inputs (the parent's base is the candidate's: both adapters sit on
        # the same weights); 1e-5 is ~100 ulps, room for a kernel's summation order, far below a wrong pair's change
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-8)
