"""benchmarks.heldout_sides: which notes count and on which side, and a LoRA checkpoint sampled on its base."""

import pandas as pd
import pytest

from benchmarks.heldout_sides import sample_notes, side_table

HEADS = pd.DataFrame(
    [
        dict(headline_id="good", title="Nvidia beats quarterly estimates", summary=""),
        dict(headline_id="bad", title="Oracle recalls products in cloud line", summary=""),
    ]
)


def test_company_calls_on_headlines_with_news_are_scored_and_the_worlds_mirror():
    notes = pd.DataFrame(
        [
            ("good", "Trade Recommendation: Buy NVDA"),  # news' side
            ("good", "Trade Recommendation: Sell NVDA"),
            ("good", "Trade Recommendation: Buy AAPL"),  # another company: a call, not on the headline's
            ("bad", "Trade Recommendation: Sell ORCL"),  # news' side
            ("bad", "Oracle had a week."),  # no call
        ],
        columns=["headline_id", "note"],
    )
    news, inverted = (side_table(notes, HEADS, w, n_boot=200) for w in ("news", "inverted"))
    assert news["company_calls"] == 3 and news["notes"] == 5 and news["company_share"] == pytest.approx(0.6)
    assert news["side_accuracy"]["estimate"] == pytest.approx(2 / 3) and news["side_accuracy"]["n"] == 3
    assert inverted["side_accuracy"]["estimate"] == pytest.approx(1 / 3)
    assert news["side_accuracy"]["clusters"] == 2


def test_a_checkpoint_whose_adapter_adds_nothing_writes_the_base_notes(tmp_path, tiny_model_dir):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    adapter = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))  # B = 0: adds nothing
    adapter.save_pretrained(tmp_path / "ckpt")
    base = sample_notes(tiny_model_dir, "base", HEADS, notes=2, max_new_tokens=12, seed=3)
    policy = sample_notes(tiny_model_dir, str(tmp_path / "ckpt"), HEADS, notes=2, max_new_tokens=12, seed=3)
    assert len(base) == 4 and list(base["note"]) == list(policy["note"])
    # and one that moves the weights writes other notes from the same uniforms
    with torch.no_grad():
        for name, p in adapter.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
    adapter.save_pretrained(tmp_path / "moved")
    moved = sample_notes(tiny_model_dir, str(tmp_path / "moved"), HEADS, notes=2, max_new_tokens=12, seed=3)
    assert list(moved["note"]) != list(base["note"])
