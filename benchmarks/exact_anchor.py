"""What the exact KL anchor on the call's name (`kl_estimator` exact, the default) costs a GSPO step, now that it
reads the policy's side from the step's own forward (`batch_logprobs_hidden`) and forwards only the base: one
training part (forward, the anchor, backward) timed both ways on the same batch and adapter, alternating, and the
step's own forward and backward alone for reference. The policy's second forward with gradients is what the
sharing removes.

    python -m benchmarks.exact_anchor [--model smollm2-135m-instruct] [--headlines 2] [--notes 8] [--repeats 3]

The notes are sampled from the model on the bundled archive's headlines (its own call_first text) and the adapter
is moved off the base, so the KL is not zero. Times are medians over the repeats on whatever machine runs it;
the ratio is the figure to read (both ways run side by side).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks._results import add_record_argument, finish


def notes(backend, data: Path, headlines: int, notes_per_headline: int, max_new_tokens: int) -> list:
    """`EncodedExample`s of the model's own notes on the first bundled day's headlines, name masks set."""
    from benchmarks._daily_common import archive_days
    from benchmarks.heldout_sides import held_out_headlines
    from outcome_flywheel.daily_rl.reward.credit import call_token_mask
    from outcome_flywheel.models.interface import SamplingConfig
    from outcome_flywheel.models.prompts import trading_note_messages
    from outcome_flywheel.models.train.batching import EncodedExample

    rows = held_out_headlines(data, archive_days(1), headlines)
    prompts = [trading_note_messages(t, s) for t, s in zip(rows["title"], rows["summary"])]
    groups = backend.sample(
        prompts, notes_per_headline, SamplingConfig(max_new_tokens=max_new_tokens), seeds=list(range(len(prompts)))
    )
    out = []
    for prompt, group in zip(prompts, groups):
        for s in group:
            mask = call_token_mask(backend.tokenizer, s.token_ids, s.text, "ticker")
            out.append(
                EncodedExample(backend.prompt_ids(prompt), list(s.token_ids), list(s.logprobs), 0.0, name_mask=mask)
            )
    return out


def run(model: str, headlines: int, notes_per_headline: int, max_new_tokens: int, repeats: int) -> dict:
    import torch

    from benchmarks.outcome_learning import model_data_dir
    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.torch.backend import TorchBackend
    from outcome_flywheel.models.train.exact_kl import exact_kl_term, named

    data = model_data_dir(Path(tempfile.mkdtemp()) / "data", model)
    backend = TorchBackend(str(data / "models" / model), device="cpu")
    batch = notes(backend, data, headlines, notes_per_headline, max_new_tokens)
    backend.prepare_for_training(keep_moments=False)
    torch.manual_seed(0)
    backend.add_lora(LoraSettings())
    with torch.no_grad():  # an adapter off the base: a KL to take
        for name, weight in backend.model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0.0, 0.02)
    prompts, responses = [b.prompt_ids for b in batch], [b.response_ids for b in batch]
    normaliser = float(len(batch) * max(len(r) for r in responses))

    def part(anchor: str) -> float:
        """Seconds of one part: the step's forward, the anchor (`own`: its own policy forward, `shared`: this
        forward's hidden states, `none`: no anchor), backward."""
        started = time.perf_counter()
        logp, mask, hidden = backend.batch_logprobs_hidden(prompts, responses, 1.0, shared_prefix=True)
        loss = -(logp * mask).sum() / normaliser
        if anchor != "none":
            term, _ = exact_kl_term(backend, batch, 0.1, 1.0, normaliser, hidden if anchor == "shared" else None)
            loss = loss + term
        loss.backward()
        backend.model.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    part("shared")  # warm-up
    times: dict[str, list[float]] = {"own": [], "shared": [], "none": []}
    for _ in range(repeats):  # side by side: a machine's noise falls on all three
        for anchor in times:
            times[anchor].append(part(anchor))
    median = {k: statistics.median(v) for k, v in times.items()}
    return dict(
        benchmark="exact_anchor",
        model=model,
        notes=len(batch),
        named_notes=len(named(batch)),
        response_tokens=int(sum(len(r) for r in responses)),
        torch_threads=torch.get_num_threads(),
        repeats=repeats,
        own_forward_s=round(median["own"], 3),
        shared_forward_s=round(median["shared"], 3),
        no_anchor_s=round(median["none"], 3),
        speedup=round(median["own"] / median["shared"], 3),
        anchor_share_of_step_shared=round((median["shared"] - median["none"]) / median["shared"], 3),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", choices=["smollm2-135m-instruct", "tiny-local"])
    parser.add_argument("--headlines", type=int, default=2)
    parser.add_argument("--notes", type=int, default=8, help="notes per headline (the trainer's minibatch: 16)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    add_record_argument(parser)
    args = parser.parse_args()
    os.environ.setdefault("FLYWHEEL_NOTE_FORMAT", "call_first")  # the grid's notes: the call (and its name) first
    finish("exact_anchor", run(args.model, args.headlines, args.notes, args.max_new_tokens, args.repeats), args.record)


if __name__ == "__main__":
    main()
