"""What a Qwen3 folder brings, built locally (`models/provision/qwen3_shapes.py`): the chat template with
`<think>` blocks and `enable_thinking`. Notes are generated without thinking and never hold a
think block, even from a model that wants to think; a thinking judge's letter is read after
`</think>`; the judge prompt fits its token budget, notes cut fairly, the cut recorded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from outcome_flywheel.daily_rl.judge.prompt_budget import CUT_MARK, cut_notes, fair_shares, prompt_budget
from outcome_flywheel.daily_rl.judge.ranking import JudgeGroup, answer_after_thinking, extract_letter, judge_groups
from outcome_flywheel.models.interface import SamplingConfig
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.provision.qwen3_shapes import build_model
from tests.tolerances import assert_logprobs_close, logprob_tolerances

NOTE = trading_note_messages("Chevron beats estimates on record output", "Shares rose 3% after hours.")
CLOSED_EMPTY_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("qwen3") / "model", "qwen3-tiny", seed=1)


@pytest.fixture(scope="module")
def torch_qwen3(qwen3_dir):
    from outcome_flywheel.models.torch.backend import TorchBackend

    return TorchBackend(qwen3_dir, device="cpu")


def _wants_to_think(backend, boost: float = 40.0):
    """Make `<think>` the model's overwhelming favourite at every position (a forward hook on the head)."""
    think = backend.tokenizer.convert_tokens_to_ids("<think>")

    def hook(module, inputs, output):
        return output.index_add(
            -1, torch.tensor([think]), torch.full((*output.shape[:-1], 1), boost, dtype=output.dtype)
        )

    return backend.model.lm_head.register_forward_hook(hook)


def test_template_renders_qwen3_conventions(torch_qwen3):
    tok = torch_qwen3.tokenizer
    off = tok.decode(torch_qwen3.prompt_ids(NOTE))
    on = tok.decode(torch_qwen3.prompt_ids(NOTE, enable_thinking=True))
    assert off.endswith(CLOSED_EMPTY_THINK)
    assert on.endswith("<|im_start|>assistant\n") and "<think>" not in on
    history = [
        *NOTE,
        {"role": "assistant", "content": "<think>\nweighing it</think>\n\nLong CVX."},
        {"role": "user", "content": "Again"},
    ]
    rendered = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert "weighing it" not in rendered and "<|im_start|>assistant\nLong CVX.<|im_end|>" in rendered
    assert torch_qwen3.think_ids == {tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")}


def test_notes_never_hold_a_think_block_even_from_a_model_that_wants_to_think(torch_qwen3):
    config = SamplingConfig(temperature=0.8, top_p=0.95, top_k=50, max_new_tokens=12)
    handle = _wants_to_think(torch_qwen3)
    try:
        thinking = torch_qwen3.sample(
            [NOTE], 4, SamplingConfig(**{**config.__dict__, "enable_thinking": True}), seeds=[0]
        )[0]
        notes = torch_qwen3.sample([NOTE, NOTE], 4, config, seeds=[0, 1])
        # the control: with thinking allowed this model does open think blocks
        assert all("<think>" in s.text for s in thinking)
        for sample in (s for group in notes for s in group):
            assert not set(sample.token_ids) & torch_qwen3.think_ids
            assert "<think>" not in sample.text and "</think>" not in sample.text
        # pi_old is still the whole vocabulary's distribution (the ban is a filter, as top-k):
        # teacher forcing reproduces the recorded log-probs
        flat = [s for group in notes for s in group]
        forced = torch_qwen3.response_logprobs([NOTE] * len(flat), [s.token_ids for s in flat], temperature=0.8)
        # per token within the rounding bound of the sampler's and teacher forcing's fp32
        # computations (tests/tolerances.py, the hooked head's logits included; was atol=1e-4)
        bounds = logprob_tolerances(torch_qwen3, [NOTE] * len(flat), [s.token_ids for s in flat], temperature=0.8)
        assert_logprobs_close([np.asarray(s.logprobs) for s in flat], forced, bounds)
    finally:
        handle.remove()


def test_mlx_notes_never_hold_a_think_block(qwen3_dir):
    mx = pytest.importorskip("mlx.core")
    import mlx.nn as nn

    from outcome_flywheel.models.mlx.backend import MLXBackend

    backend = MLXBackend(qwen3_dir)
    think = backend.tokenizer.convert_tokens_to_ids("<think>")

    class Boosted(nn.Module):
        def __init__(self, head):
            super().__init__()
            self.head = head
            bias = np.zeros(head.weight.shape[0], dtype=np.float32)
            bias[think] = 40.0
            self.bias = mx.array(bias)

        def __call__(self, x):
            return self.head(x) + self.bias

    backend.model.lm_head = Boosted(backend.model.lm_head)
    config = SamplingConfig(temperature=0.8, top_p=0.95, top_k=50, max_new_tokens=10)
    thinking = backend.sample([NOTE], 3, SamplingConfig(**{**config.__dict__, "enable_thinking": True}), seeds=[0])[0]
    assert all("<think>" in s.text for s in thinking)
    for sample in backend.sample([NOTE], 3, config, seeds=[0])[0]:
        assert not set(sample.token_ids) & backend.think_ids and "<think>" not in sample.text


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("<think>\nA is vague, B names the stop. C?</think>\n\nB", 1),
        ("<think>D looks best</think>\n\n[C]", 2),
        ("<think>\nI keep weighing A against B", None),  # cut off while thinking: no answer
        ("<think></think>A", 0),
        ("C", 2),
    ],
)
def test_the_letter_is_read_after_the_think_block(answer, expected):
    assert extract_letter(answer, 4) == expected


def test_answer_after_thinking_keeps_plain_answers():
    assert answer_after_thinking("B") == "B"
    assert answer_after_thinking(None) is None
    assert answer_after_thinking("<think>x</think>y</think> D") == " D"


class ScriptedJudge:
    """A judge backend that records how it is asked; it thinks, then answers the last letter shown."""

    context_length = 4096

    def __init__(self, tokenizer_backend):
        self.tok = tokenizer_backend
        self.configs, self.greedy_calls = [], 0

    def prompt_ids(self, messages, enable_thinking=False):
        return self.tok.prompt_ids(messages, enable_thinking)

    def text_ids(self, text):
        return self.tok.text_ids(text)

    def decode(self, ids):
        return self.tok.decode(ids)

    def sample(self, prompts, n, config, seeds):
        self.configs.append(config)
        out = []
        for p in prompts:
            shown = p[-1]["content"].count("\n[")
            out.append(
                [
                    type(
                        "S",
                        (),
                        {"text": f"<think>A is weak; {'ABCDEFGH'[shown - 1]} fits</think>\n\n{'ABCDEFGH'[shown - 1]}"},
                    )()
                ]
            )
        return out

    def greedy(self, prompts, max_new_tokens):  # pragma: no cover - the thinking answers parse
        self.greedy_calls += 1
        return ["A"] * len(prompts)


def test_a_thinking_judge_ranks_from_the_letter_after_its_reasoning(torch_qwen3):
    judge = ScriptedJudge(torch_qwen3)
    group = JudgeGroup("Oil rises", ["Oil climbs on supply cuts"], ["note one", "note two", "note three"], seed=4)
    [judgement] = judge_groups(judge, [group], max_new_tokens=256, enable_thinking=True, shuffle=False)
    assert all(c.enable_thinking for c in judge.configs) and judge.greedy_calls == 0
    assert judgement.ranks == [3, 2, 1]  # the last shown each round: C, then B
    assert judgement.rounds_answered == 2 and judgement.retries == 0


def test_fair_shares_fill_short_notes_first():
    assert fair_shares([10, 500, 40, 500], 400) == [10, 175, 40, 175]
    assert fair_shares([10, 20], 400) == [10, 20]
    shares = fair_shares([300] * 8, 1000)
    assert sum(shares) <= 1000 and len(set(shares)) == 1
    assert prompt_budget(4096, 1024, 8) == 1016 and prompt_budget(4096, None, 8) == 4096


def test_eight_long_notes_fit_the_judge_budget_cut_fairly_and_recorded(torch_qwen3):
    rng = np.random.default_rng(0)
    words = "long short crude output margin guidance stop loss risk rally".split()
    long_notes = [" ".join(rng.choice(words, size=600)) for _ in range(6)]
    notes = ["Buy CVX.", "Sell XOM, stop 5%."] + long_notes
    budget = 900
    group = JudgeGroup("Chevron beats", ["Chevron rises 3%"], notes, seed=9)
    prompts = []

    class Recording(ScriptedJudge):
        def sample(self, p, n, config, seeds):
            prompts.extend(p)
            return super().sample(p, n, config, seeds)

    judge = Recording(torch_qwen3)
    [judgement] = judge_groups(judge, [group], max_new_tokens=8, prompt_tokens=budget, shuffle=False)
    assert max(len(torch_qwen3.prompt_ids(p)) for p in prompts) <= budget
    assert judgement.prompt_tokens <= budget
    assert judgement.shown_tokens[:2] == judgement.note_tokens[:2]  # short notes are never cut
    cut = judgement.shown_tokens[2:]
    assert max(cut) - min(cut) <= 1 and all(judgement.truncated(k) for k in range(2, 8))
    assert not judgement.truncated(0)
    assert CUT_MARK.strip() in prompts[0][-1]["content"]


def test_a_budget_too_small_for_the_notes_is_a_clear_error(torch_qwen3):
    with pytest.raises(ValueError, match="prompt budget"):
        cut_notes(["a note"] * 8, 40, torch_qwen3.text_ids, torch_qwen3.decode)
