"""benchmarks.side_margin: the lean read off the model's own log-probs, the table it makes, and the paired change."""

import numpy as np
import pandas as pd
import pytest

from benchmarks.side_margin import OPENING, SIDES, gap_change, lean_table, side_margins

HEADS = pd.DataFrame(
    [
        dict(title="Nvidia beats quarterly estimates", summary=""),
        dict(title="Oracle recalls products in cloud line", summary=""),
    ]
)


@pytest.mark.parametrize("note_format", ["call_first", "sections"])
def test_the_margin_is_the_two_sides_log_probabilities_after_the_opening(tiny_model_dir, note_format, monkeypatch):
    """The same figure from the project's own backend: the opening and each side as the response, the side's
    tokens summed, under the prompt asked for whatever the shell's FLYWHEEL_NOTE_FORMAT says. Both run the
    float32 model; the backend's log-softmax is float32, ours float64 over float32 logits, so each token's
    log-prob agrees to a few float32 ulps of the logits' size, far under 1e-4."""
    from outcome_flywheel.models.prompts import trading_note_messages
    from outcome_flywheel.models.torch.backend import TorchBackend

    other = {"call_first": "sections", "sections": "call_first"}[note_format]
    monkeypatch.setenv("FLYWHEEL_NOTE_FORMAT", other)
    margins = side_margins(tiny_model_dir, "base", HEADS, note_format)
    assert not np.allclose(margins, side_margins(tiny_model_dir, "base", HEADS, other), atol=1e-3)
    backend = TorchBackend(tiny_model_dir, device="cpu")
    opening = backend.text_ids(OPENING)
    for (title, summary), margin in zip(zip(HEADS["title"], HEADS["summary"]), margins):
        prompt = backend.prompt_ids(trading_note_messages(title, summary, note_format))
        sides = [backend.text_ids(s) for s in SIDES]
        logp, _ = backend.batch_logprobs([prompt] * 2, [opening + s for s in sides])
        logp = logp.detach().double().numpy()
        by_side = [logp[k, len(opening) : len(opening) + len(s)].sum() for k, s in enumerate(sides)]
        assert margin == pytest.approx(by_side[0] - by_side[1], abs=1e-4)


def test_the_lean_table_and_a_checkpoint_against_itself():
    margins = np.array([2.0, 1.0, -0.5, 0.5, 3.0])
    news = np.array([1, 1, -1, -1, 0])  # the last headline has no news: left out
    table = lean_table(margins, news)
    assert table["good"] == pytest.approx(1.5) and table["bad"] == pytest.approx(0.0) and table["gap"] == 1.5
    # news rule: Buy on good, Sell on bad: 3 of 4 right; inverted is the rest
    assert table["accuracy"] == {"news": 0.75, "inverted": 0.25} and table["headlines"] == 4
    same = gap_change(margins, margins, news, n_boot=200)
    assert same == {"estimate": 0.0, "low": 0.0, "high": 0.0}
    leaned = gap_change(margins, margins - 2 * (news < 0), news, n_boot=200)  # bad news pushed to Sell
    assert leaned["estimate"] == pytest.approx(2.0) and leaned["low"] == pytest.approx(2.0)
    assert gap_change(margins, margins, np.array([1, 1, 0, 0, 0]), n_boot=10) is None  # no bad news: no gap
