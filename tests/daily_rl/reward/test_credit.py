"""Credit where it is due: the call's line as tokens, the per-token loss by hand in both mirrors, the
per-token advantages each step hands the trainer, and the objectives that may train them."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from outcome_flywheel.daily_rl.notes.calls import call_spans, parse_call
from outcome_flywheel.daily_rl.reward.credit import call_token_mask, judged_token_advantages, price_token_advantages
from outcome_flywheel.daily_rl.reward.signals import RewardConfig, token_advantages
from outcome_flywheel.models.spans import span_token_mask, token_char_ends
from outcome_flywheel.models.train.gspo import train_gspo

NOTE = (
    "Trade Recommendation: Buy Meta.\nRationale: The headline matters for Meta because demand is strong.\n"
    "Risk Factors: Rates may stay higher.\nTimeframe: 1-2 weeks.\nPosition Size: 1% of the portfolio.\n"
    "Stop Loss: 3% below entry."
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


# -- the call's line --------------------------------------------------------------------------
def test_call_spans_cover_the_line_the_parser_reads():
    assert [NOTE[a:b] for a, b in call_spans(NOTE)] == ["Trade Recommendation: Buy Meta."]
    headed = (
        "<think>long\nthoughts</think>\n## Trade Recommendation\n**Sell** $AAPL into strength\n\n## Rationale\nWeak."
    )
    assert parse_call(headed).side == "short"
    assert [headed[a:b] for a, b in call_spans(headed)] == ["**Sell** $AAPL into strength"]
    side_line = "## Thesis\nMargins improve.\nSide: long\nTicker: NVDA\n"
    assert [side_line[a:b] for a, b in call_spans(side_line)] == ["Side: long", "Ticker: NVDA"]
    prose = "I would buy Apple here. It is cheap.\nMore text."
    assert [prose[a:b] for a, b in call_spans(prose)] == ["I would buy Apple here. It is cheap."]
    assert call_spans("No view at all on this.") == [] and call_spans("") == []


def test_the_span_mask_selects_the_call_line_tokens(tokenizer):
    ids = tokenizer(NOTE, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    mask = call_token_mask(tokenizer, ids, NOTE)
    picked = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert picked.strip() == "Trade Recommendation: Buy Meta."
    assert mask[-1] is False  # the end-of-turn token has no characters
    first_rationale = next(
        i for i, (a, _) in enumerate(token_char_ends(tokenizer, ids)) if a >= NOTE.index("Rationale")
    )
    assert not any(mask[first_rationale:])


def test_the_mask_holds_for_a_tokenisation_the_encoder_would_not_choose(tokenizer):
    """A sampled response can split text differently from the encoder: offsets then come from decoding
    prefixes, and the mask still covers exactly the call line's characters."""
    ids = tokenizer(NOTE, add_special_tokens=False)["input_ids"]
    first = tokenizer.convert_ids_to_tokens(ids[0])
    split = [tokenizer.convert_tokens_to_ids(ch) for ch in first]
    assert all(isinstance(t, int) and t != tokenizer.unk_token_id for t in split) and len(split) > 1
    odd = split + ids[1:]
    assert tokenizer.decode(odd) == tokenizer.decode(ids)
    mask = span_token_mask(tokenizer, odd, call_spans(NOTE))
    assert tokenizer.decode([t for t, m in zip(odd, mask) if m]).strip() == "Trade Recommendation: Buy Meta."
    assert all(mask[: len(split)])


def test_a_note_without_a_call_line_gets_no_price_credit(tokenizer):
    """No call line: relevance judges the whole note (`judged_token_advantages`), but the price has no side
    to credit, so it spreads nothing over the note's tokens."""
    text = "Markets were quiet today.\nNothing else to add."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert call_token_mask(tokenizer, ids, text) is None
    assert call_token_mask(tokenizer, ids, text, "side") is None
    assert price_token_advantages(len(ids), 0.7, None) == [0.0] * len(ids)
    reward = RewardConfig()
    assert judged_token_advantages(reward, len(ids), 1.0, None) == pytest.approx([reward.share("relevance")] * len(ids))


def test_the_price_trains_the_side_and_relevance_the_ticker(tokenizer):
    """Within the call's line, the side phrase is what the price judges and the named ticker what relevance
    judges (`call_part_spans`); each mask is a strict part of the line's."""
    from outcome_flywheel.daily_rl.notes.calls import call_part_spans

    parts = call_part_spans(NOTE)
    assert [NOTE[a:b] for a, b in parts["side"]] == ["Buy"]
    assert [NOTE[a:b] for a, b in parts["ticker"]] == [" Meta."]  # no symbol written: the line less its side
    ticker = "## Trade Recommendation\n**Sell** $AAPL into strength\nTicker: AAPL\n## Rationale\nWeak."
    parts = call_part_spans(ticker)
    assert [ticker[a:b] for a, b in parts["side"]] == ["Sell"]
    assert [ticker[a:b] for a, b in parts["ticker"]] == ["AAPL", "AAPL"]
    assert call_part_spans("No view at all on this.") == {}
    ids = tokenizer(NOTE, add_special_tokens=False)["input_ids"]
    side = call_token_mask(tokenizer, ids, NOTE, "side")
    name = call_token_mask(tokenizer, ids, NOTE, "ticker")
    line = call_token_mask(tokenizer, ids, NOTE)
    assert tokenizer.decode([t for t, m in zip(ids, side) if m]).strip() == "Buy"
    assert "Meta" in tokenizer.decode([t for t, m in zip(ids, name) if m])
    assert not any(a and b for a, b in zip(side, name))
    assert all(line[i] for i, (a, b) in enumerate(zip(side, name)) if a or b)
    with pytest.raises(ValueError, match="price_span"):
        from outcome_flywheel.daily_rl.reward.credit import CreditConfig

        CreditConfig(price_span="note")


# -- per-token advantages ---------------------------------------------------------------------
def test_token_advantages_sum_share_times_advantage_over_the_parts_spans():
    # shares: note 0.4, relevance 0.2, price 0.4
    reward = RewardConfig(weights={"structure": 0.5, "judge_rank": 0.5, "relevance": 0.5, "price": 1.0})
    mask = [False, True, True, False]
    assert judged_token_advantages(reward, 4, relevance_advantage=-1.0, call_mask=mask) == pytest.approx(
        [0.0, -0.2, -0.2, 0.0]
    )
    assert price_token_advantages(4, reward.share("price") * 2.0, mask) == pytest.approx([0.0, 0.8, 0.8, 0.0])
    assert token_advantages(4, [(0.5, 1.0, None), (0.25, 2.0, mask)]) == pytest.approx([0.5, 1.0, 1.0, 0.5])
    assert token_advantages(3, []) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="span mask of 2 tokens"):
        token_advantages(3, [(1.0, 1.0, [True, False])])


def test_training_examples_put_relevance_on_the_calls_name_only(tokenizer):
    from outcome_flywheel.daily_rl.reward.examples import training_examples

    notes = [NOTE, NOTE.replace("Buy Meta", "Sell Apple")]
    rows = []
    for k, text in enumerate(notes):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(
            dict(
                date="2025-11-04",
                headline_id="h1",
                rollout_index=k,
                response=text,
                response_ids=ids,
                behavior_logprobs=[-1.0] * len(ids),
                prompt='[{"role": "user", "content": "x"}]',
            )
        )
    rollouts = pd.DataFrame(rows)
    scores = pd.DataFrame(
        dict(
            headline_id=["h1", "h1"],
            rollout_index=[0, 1],
            advantage=[0.0, 0.0],
            usable=[True, True],
            relevance_advantage=[1.0, -1.0],
        )
    )
    reward = RewardConfig()
    examples = training_examples(rollouts, scores, reward=reward, tokenizer=tokenizer)
    assert len(examples) == 2  # the note part is 0, the relevance part is not: both train
    assert [ex.advantage for ex in examples] == [0.0, 0.0]  # the whole-note (sequence) part
    for ex, sign, name in zip(examples, (1, -1), ("Meta.", "Apple.")):
        on = [i for i, a in enumerate(ex.token_advantages) if a != 0]
        assert tokenizer.decode([ex.response_ids[i] for i in on]).strip() == name  # the name, not the side
        assert all(ex.token_advantages[i] == pytest.approx(sign * reward.share("relevance")) for i in on)
    # without a reward config: one advantage per note, as before (zero here: nothing to train)
    assert training_examples(rollouts, scores) == []


# -- the loss by hand ---------------------------------------------------------------------------
LOGP = [[-1.2, -0.4, -2.0], [-0.7, -3.0, -0.5]]
OLD = [[-1.0, -0.6, -2.1], [-0.2, -3.4, -0.5]]
BEHAVIOUR = [[-1.3, -0.6, -2.1], [-0.2, -4.4, -0.5]]
REF = [[-1.1, -0.5, -1.9], [-0.6, -3.1, -0.4]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [[0.0, 1.5, 0.0], [-0.5, -0.5, 9.0]]  # the padded position's advantage must not count
SEQ = [0.8, -1.1]  # the whole-note part of each note
SEQ_CLIP = (0.04, 0.07)  # wide enough that one of the two sequences is clipped at these log-probs
EPS_LOW, EPS_HIGH, CAP, BETA, Z = 0.2, 0.28, 2.0, 0.1, 6.0
NAME = [[0, 1, 0], [1, 0, 1]]  # `kl_span` ticker: the KL on these tokens only (the padded one must not count)


def hand_token_loss(kl_mask=None) -> tuple[float, list[list[float]]]:
    """The token objective and d loss / d logp written out one token at a time; `kl_mask`: the tokens the
    KL term covers (None: every response token)."""
    total, grad = 0.0, [[0.0] * 3 for _ in range(2)]
    for i in range(2):
        for t in range(3):
            if not MASK[i][t]:
                continue
            a = ADV[i][t]
            r = math.exp(LOGP[i][t] - OLD[i][t])
            clipped = min(max(r, 1 - EPS_LOW), 1 + EPS_HIGH)
            w = min(math.exp(OLD[i][t] - BEHAVIOUR[i][t]), CAP)
            unclipped_active = r * a <= clipped * a
            q = REF[i][t] - LOGP[i][t]
            beta = BETA * (1 if kl_mask is None else kl_mask[i][t])
            total += -w * min(r * a, clipped * a) + beta * (math.exp(q) - 1 - q)
            grad[i][t] = ((-w * a * r) if unclipped_active else 0.0) + beta * (1 - math.exp(q))
    total, grad = total / Z, [[g / Z for g in row] for row in grad]
    for i in range(2):  # + sum_i |y_i| (-w_i min(s_i N_i, clip(s_i) N_i)) / Z: the same normaliser as the tokens'
        tokens = [t for t in range(3) if MASK[i][t]]
        s_i = math.exp(sum(LOGP[i][t] - OLD[i][t] for t in tokens) / len(tokens))
        w_i = min(math.exp(sum(OLD[i][t] - BEHAVIOUR[i][t] for t in tokens) / len(tokens)), CAP)
        clipped = min(max(s_i, 1 - SEQ_CLIP[0]), 1 + SEQ_CLIP[1])
        total += -w_i * min(s_i * SEQ[i], clipped * SEQ[i]) * len(tokens) / Z
        if s_i * SEQ[i] <= clipped * SEQ[i]:  # d s_i / d logp_it = s_i / |y_i|: each token's pull is N_i s_i / Z
            for t in tokens:
                grad[i][t] += -w_i * SEQ[i] * s_i / Z
    return total, grad


def hand_kl(kl_mask=None) -> float:
    """The reported kl: the mean k3 over the tokens the KL term covers."""
    covered = [(i, t) for i in range(2) for t in range(3) if MASK[i][t] and (kl_mask is None or kl_mask[i][t])]
    k3 = [math.exp(REF[i][t] - LOGP[i][t]) - 1 - (REF[i][t] - LOGP[i][t]) for i, t in covered]
    return sum(k3) / len(k3)


@pytest.mark.parametrize("kl_mask", [None, NAME], ids=["kl_on_the_note", "kl_on_the_ticker"])
def test_token_loss_by_hand_torch(kl_mask):
    import torch

    from outcome_flywheel.models.torch.losses import gspo_loss

    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    loss, metrics = gspo_loss(
        logp,
        t(OLD),
        t(MASK).bool(),
        t(ADV),
        EPS_LOW,
        EPS_HIGH,
        "token",
        t(BEHAVIOUR),
        CAP,
        t(REF),
        BETA,
        Z,
        t(SEQ),
        SEQ_CLIP,
        None if kl_mask is None else t(kl_mask),
    )
    loss.backward()
    expected, grad = hand_token_loss(kl_mask)
    # float64 throughout: a handful of exp and sums, so agreement to 1e-12 is the arithmetic's
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert logp.grad.numpy() == pytest.approx(np.array(grad), rel=1e-12, abs=1e-15)
    assert metrics["is_truncated_fraction"] == pytest.approx(1 / 5)  # exp(1.0) > 2 on one of the 5 tokens
    assert 0 < metrics["clip_fraction"] <= 1 and metrics["kl"] == pytest.approx(hand_kl(kl_mask), rel=1e-12)
    assert hand_kl(NAME) != pytest.approx(hand_kl(None), rel=1e-3)  # the two spans tell apart here
    assert metrics["sequence_clip_fraction"] == pytest.approx(0.5)  # one of the two notes' sequence term is clipped


@pytest.mark.parametrize("kl_mask", [None, NAME], ids=["kl_on_the_note", "kl_on_the_ticker"])
def test_token_loss_by_hand_mlx(kl_mask):
    mx = pytest.importorskip("mlx.core")
    from outcome_flywheel.models.mlx.losses import gspo_loss

    a = lambda x: mx.array(np.array(x, dtype=np.float32))  # noqa: E731

    def f(logp):
        return gspo_loss(
            logp,
            a(OLD),
            a(MASK).astype(mx.bool_),
            a(ADV),
            EPS_LOW,
            EPS_HIGH,
            "token",
            a(BEHAVIOUR),
            CAP,
            a(REF),
            BETA,
            Z,
            a(SEQ),
            SEQ_CLIP,
            None if kl_mask is None else a(kl_mask),
        )

    loss, metrics = f(a(LOGP))
    grad = mx.grad(lambda x: f(x)[0])(a(LOGP))
    expected, hand_grad = hand_token_loss(kl_mask)
    # float32 over ~5 terms of size ~1: relative error of a few ulps (~1e-7), bounded by 1e-5
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert np.array(grad) == pytest.approx(np.array(hand_grad), rel=1e-5, abs=1e-7)
    assert metrics["is_truncated_fraction"].item() == pytest.approx(1 / 5)
    # k3 = exp(q) - 1 - q at |q| = 0.1 is ~5e-3, the difference of terms ~1: float32 leaves a few ulps of 1
    # (~1e-7 each) absolute, up to ~1e-4 of the value relative, so the bound is absolute
    assert metrics["kl"].item() == pytest.approx(hand_kl(kl_mask), abs=1e-6)


def test_both_mirrors_agree_on_every_metric():
    mx = pytest.importorskip("mlx.core")
    import torch

    from outcome_flywheel.models.mlx.losses import gspo_loss as mlx_loss
    from outcome_flywheel.models.torch.losses import gspo_loss as torch_loss

    t = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    a = lambda x: mx.array(np.array(x, dtype=np.float32))  # noqa: E731
    _, mt = torch_loss(
        t(LOGP),
        t(OLD),
        t(MASK).bool(),
        t(ADV),
        EPS_LOW,
        EPS_HIGH,
        "token",
        t(BEHAVIOUR),
        CAP,
        t(REF),
        BETA,
        Z,
        t(SEQ),
        SEQ_CLIP,
    )
    _, mm = mlx_loss(
        a(LOGP),
        a(OLD),
        a(MASK).astype(mx.bool_),
        a(ADV),
        EPS_LOW,
        EPS_HIGH,
        "token",
        a(BEHAVIOUR),
        CAP,
        a(REF),
        BETA,
        Z,
        a(SEQ),
        SEQ_CLIP,
    )
    assert set(mt) == set(mm)
    for name in mt:  # float32 means of <= 6 values: a few ulps
        assert mm[name].item() == pytest.approx(mt[name], rel=1e-5, abs=1e-7), name


def test_a_uniform_advantage_at_ratio_one_is_the_reward_weighted_gradient():
    """With every ratio 1, no IS weight and no KL, the token objective's gradient is -A_t / Z per token:
    the group-normalised reward-weighted log-likelihood, as GSPO's at s_i = 1 (length aside)."""
    import torch

    from outcome_flywheel.models.torch.losses import gspo_loss

    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([0.5, -2.0], dtype=torch.float64)
    mask = torch.tensor(MASK).bool()
    loss, _ = gspo_loss(
        logp, logp.detach(), mask, adv, objective="token", epsilon_low=0.2, epsilon_high=0.28, normaliser=4.0
    )
    loss.backward()
    expected = -(adv[:, None] * mask) / 4.0
    # float64, exp(0) = 1 exactly, then a product and a division by 4: a few 2^-53, far below 1e-12
    assert torch.allclose(logp.grad, expected, rtol=1e-12, atol=0)


def test_sequence_objectives_refuse_span_scoped_advantages(tiny_model_dir):
    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.loader import ModelLoader
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

    policy = ModelLoader(
        data_dir=str(tiny_model_dir.parent), base_model=str(tiny_model_dir), backend="torch", device="cpu"
    ).load()
    ids = policy.encode_response("Trade Recommendation: Buy Meta.")
    example = GSPOExample(
        prompt=[{"role": "user", "content": "x"}],
        response_ids=ids,
        behavior_logprobs=[-1.0] * len(ids),
        advantage=0.0,
        token_advantages=[0.5] + [0.0] * (len(ids) - 1),
    )
    with pytest.raises(ValueError, match="use objective 'token'"):
        train_gspo(policy, [example], GSPOConfig(objective="gspo", lora=LoraSettings(r=2, alpha=4)))
    for bad in (dict(kl_beta=-0.1), dict(epsilon_low=1.5), dict(objective="sequence")):
        with pytest.raises(ValueError):
            GSPOConfig(**bad)
    assert GSPOConfig().clip_band() == (0.2, 0.28) and GSPOConfig(objective="gspo").clip_band() == (3e-4, 4e-4)


def test_the_ticker_kl_span_penalises_the_named_symbol_only(tiny_model_dir, tokenizer):
    """`kl_span` ticker: the KL term covers each example's `name_mask`. Trained from the same seed, a run whose
    examples name no symbol (masks all False) ends where a run without the KL does, to the last bit; a run
    with the KL on the note, or on real name masks, ends elsewhere; the training row says which."""
    import torch

    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.loader import ModelLoader
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

    notes = [NOTE, NOTE.replace("Buy Meta", "Sell Apple"), NOTE.replace("Buy Meta", "Buy Pfizer")]

    def trained(kl_beta: float, kl_span: str, named: bool) -> tuple[torch.Tensor, str]:
        policy = ModelLoader(
            data_dir=str(tiny_model_dir.parent), base_model=str(tiny_model_dir), backend="torch", device="cpu"
        ).load()
        examples = []
        for k, text in enumerate(notes):
            ids = policy.encode_response(text)
            name = call_token_mask(tokenizer, ids, text, "ticker")
            assert name is not None and any(name)
            examples.append(
                GSPOExample(
                    prompt=[{"role": "user", "content": "x"}],
                    response_ids=ids,
                    behavior_logprobs=[-1.0] * len(ids),
                    advantage=(1.0, -1.0, 0.5)[k],
                    name_mask=name if named else [False] * len(ids),
                )
            )
        config = GSPOConfig(
            kl_beta=kl_beta,
            kl_span=kl_span,
            kl_estimator="k3",  # the sampled-token estimator, the one that can cover the whole note
            epochs=3,
            batch_size=1,
            learning_rate=5e-3,
            lora=LoraSettings(r=2, alpha=4),
        )
        policy.framework.seed(0)  # the fresh adapter's init: the caller seeds it (gspo.py), as the daily loop does
        stats = train_gspo(policy, examples, config)
        weights = torch.cat([p.detach().flatten() for n, p in policy.model.named_parameters() if "lora_" in n])
        return weights, stats.extra["kl_reference"]

    without, _ = trained(0.0, "note", True)
    nothing_named, reference = trained(1.0, "ticker", False)
    assert torch.equal(without, nothing_named) and reference == "base (adapter off); on the call's ticker only"
    on_the_note, reference = trained(1.0, "note", True)
    assert not torch.equal(without, on_the_note) and reference == "base (adapter off)"
    on_the_names, _ = trained(1.0, "ticker", True)
    assert not torch.equal(without, on_the_names) and not torch.equal(on_the_note, on_the_names)
    with pytest.raises(ValueError, match="kl_span must be one of note, ticker"):
        GSPOConfig(kl_span="side")
