"""`trim_unread_tail` (GSPOConfig): a note is forwarded only up to the last token a loss term reads. The cut
(which tokens, which notes keep every token, which settings turn it off) and, in both frameworks, the update it
leaves unchanged: the same step loss, the same pull of each reward part, over fewer tokens."""

from __future__ import annotations

from dataclasses import replace

import pytest

from outcome_flywheel.models.train.batching import EncodedExample, gspo_minibatches, reads_span_only, trimmed
from outcome_flywheel.models.train.gspo_config import Counterfactual, GSPOConfig
from tests.daily_rl.reward import side_pairs as sp

HEADLINES = [("Meta beats estimates", "Revenue rose."), ("Meta misses estimates", "Revenue fell.")]


def encoded(advantage: float = 0.0, **fields) -> EncodedExample:
    """A 10-token note: a span advantage on token 2, the name on token 4, the counterfactual's own action on 3."""
    pair = Counterfactual([i == 3 for i in range(10)], [7, 8, 9, 11], [False, False, False, True], 0.5, 1)
    base = dict(
        prompt_ids=[1, 2],
        response_ids=list(range(10, 20)),
        behavior_logprobs=[-0.1 * i for i in range(10)],
        advantage=advantage,
        token_advantages=[0.7 if i == 2 else 0.0 for i in range(10)],
        token_part="price",
        counterfactual=pair,
        name_mask=[i == 4 for i in range(10)],
    )
    return EncodedExample(**{**base, **fields})


def test_a_note_is_cut_after_the_last_token_a_term_reads():
    """The name (4) is read last: 5 tokens kept, every per-token list cut alike, the sampled length kept. Without
    the name the counterfactual's action (3) is last; without any read token the first stays."""
    cut = trimmed(encoded(), True)
    assert cut.response_ids == list(range(10, 15)) and cut.length == 10 and cut.sampled_length == 10
    assert len(cut.behavior_logprobs) == len(cut.token_advantages) == len(cut.name_mask) == 5
    assert len(cut.counterfactual.own_mask) == 5 and cut.counterfactual.other_response_ids == [7, 8, 9, 11]
    assert len(trimmed(encoded(name_mask=None), True).response_ids) == 4
    assert len(trimmed(encoded(name_mask=None, counterfactual=None), True).response_ids) == 3
    bare = encoded(name_mask=None, counterfactual=None, token_advantages=None)
    assert trimmed(bare, True).response_ids == [10] and trimmed(bare, True).length == 10
    # a note read to its last token, or with a whole-note advantage (every token), or with the trim off: whole
    assert trimmed(encoded(name_mask=[i == 9 for i in range(10)]), True).sampled_length is None
    for kept in (trimmed(encoded(advantage=0.3), True), trimmed(encoded(), False)):
        assert kept.response_ids == list(range(10, 20)) and kept.sampled_length is None and kept.length == 10


def test_the_trim_is_off_where_a_term_reads_every_token():
    """`gspo` / `reward_weighted` average every token's log-ratio, a k3 KL over the note covers every token."""
    on = GSPOConfig(trim_unread_tail=True)
    assert reads_span_only(on) and not reads_span_only(GSPOConfig())  # off by default
    assert not reads_span_only(replace(on, objective="gspo"))
    assert not reads_span_only(replace(on, kl_span="note", kl_estimator="k3"))
    assert reads_span_only(replace(on, kl_span="note", kl_estimator="k3", kl_beta=0.0))


def day_examples(tiny_model_dir) -> list:
    """Two matured long calls on Meta (the side pair; the name after the side, for the KL anchor; a price
    advantage on the side and on the token after the name, the last one read) and a judged note with a whole-note
    advantage (kept whole), shorter than the calls, so the update's longest note is a cut one; a judged note whose
    only part is its name's relevance (cut: the note part's tokens still count its whole length)."""
    calls = sp.long_calls(tiny_model_dir, [(HEADLINES[0], 2.0), (HEADLINES[1], -1.5)])
    out = []
    for example, sign in zip(calls, (1.0, -1.0)):
        own = example.counterfactual.own_mask
        side = own.index(True)
        out.append(
            replace(
                example,
                token_advantages=[sign * 0.8 if m or i == side + 2 else 0.0 for i, m in enumerate(own)],
                name_mask=[i == side + 1 for i in range(len(own))],
            )
        )
    judged = calls[0]
    short = dict(response_ids=judged.response_ids[:20], behavior_logprobs=judged.behavior_logprobs[:20])
    out.append(
        replace(judged, advantage=0.4, counterfactual=None, token_part="relevance", token_advantages=None, **short)
    )
    name = out[0].name_mask.index(True)
    relevance = [0.5 if i == name else 0.0 for i in range(len(judged.response_ids))]
    out.append(replace(judged, counterfactual=None, token_part="relevance", token_advantages=relevance))
    return out


@pytest.mark.parametrize(("framework", "normaliser"), [("torch", "shared"), ("torch", "per_part"), ("mlx", "shared")])
def test_the_trimmed_update_is_the_whole_notes_update(tiny_model_dir, framework, normaliser):
    """One step on the four notes with the trim on and off, each from the same fresh policy, under either
    `part_normaliser`: the step's loss and each part's gradient norm (note, relevance, price, counterfactual)
    agree, and the trimmed step forwarded fewer tokens.

    Tolerance: the model is causal, so each kept token's log-prob is the same number computed over a shorter
    sequence; only the float32 reductions' order may differ (attention over fewer keys, another padded width),
    a relative error of a few float32 epsilons (1.2e-7) times the reduction depth per log-prob. The loss and the
    gradients sum O(10) such terms of O(1): 1e-4 relative bounds that with room, and a cut that dropped a read
    token or a normaliser over the kept lengths moves them by far more (the normaliser: by a factor)."""
    from outcome_flywheel.models.train.gspo import train_gspo

    examples = day_examples(tiny_model_dir)
    config = replace(sp.term_only("centered_pair", 1), batch_size=8, part_normaliser=normaliser)
    runs = {}
    for trim in (True, False):
        policy = sp.policy_on(framework, tiny_model_dir)
        runs[trim] = train_gspo(policy, examples, replace(config, trim_unread_tail=trim))
    on, off = runs[True], runs[False]
    assert on.steps == off.steps == 1
    assert on.extra["response_tokens"] == off.extra["response_tokens"] == off.extra["response_tokens_forwarded"]
    assert on.losses[0] == pytest.approx(off.losses[0], rel=1e-4)
    for part in ("note", "relevance", "price", "counterfactual"):
        assert off.extra[f"grad_norm_{part}"] > 0, part
        assert on.extra[f"grad_norm_{part}"] == pytest.approx(off.extra[f"grad_norm_{part}"], rel=1e-4), part
    for name in ("side_probability_own", "side_probability_other"):
        assert on.extra[name][0] == pytest.approx(off.extra[name][0], rel=1e-4), name
    # the calls end after the token past their name, the name-only judged note at its name, the other stays whole
    kept = [e.counterfactual.own_mask.index(True) + 3 for e in examples[:2]]
    kept += [len(examples[2].response_ids), examples[3].token_advantages.index(0.5) + 1]
    assert on.extra["response_tokens_forwarded"] == sum(kept) < off.extra["response_tokens"]


def test_the_minibatches_carry_the_cut_notes(tiny_model_dir):
    """`gspo_minibatches` cuts the calls and keeps the judged note whole with the trim on; off (the default), none."""
    from outcome_flywheel.models.torch.backend import TorchBackend

    policy = TorchBackend(tiny_model_dir, device="cpu")
    examples = day_examples(tiny_model_dir)
    on = [
        b
        for batch in gspo_minibatches(examples, GSPOConfig(epochs=1, trim_unread_tail=True), policy.prompt_ids)
        for b in batch
    ]
    off = [b for batch in gspo_minibatches(examples, GSPOConfig(epochs=1), policy.prompt_ids) for b in batch]
    by_index = {b.index: b for b in on}
    assert by_index[2].sampled_length is None
    for i in (0, 1):
        assert by_index[i].length == len(examples[i].response_ids) > len(by_index[i].response_ids)
    assert all(b.sampled_length is None for b in off)
