"""GSPO training speed: padded minibatches vs one example at a time (the original loop's way).

Same data (tiny-local samples, 64 new tokens, group-normalised advantages), same number of
passes, the same fresh policy each time; only the batching differs. Padded minibatches are
timed as the trainer runs them (each headline's shared prompt computed once per minibatch) and,
for reference, with every row's prompt recomputed.

    python -m benchmarks.gspo_batching [--headlines 8] [--rollouts 8] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks._daily_common import tiny_local_data_dir
from benchmarks._results import add_record_argument, finish


def run(
    headlines: int = 8, rollouts: int = 8, batch_size: int = 16, max_new_tokens: int = 64, repeats: int = 2
) -> dict:
    from outcome_flywheel.daily_rl.notes.structure import structure_score
    from outcome_flywheel.daily_rl.reward.signals import group_advantages
    from outcome_flywheel.models.interface import SamplingConfig
    from outcome_flywheel.models.loader import ModelLoader
    from outcome_flywheel.models.prompts import trading_note_messages
    from outcome_flywheel.models.train.gspo import train_gspo
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample
    from scripts.make_tiny_local_corpus import make_notes

    root = tiny_local_data_dir()
    model_backend = ModelLoader(data_dir=str(root), device="cpu")
    rows = make_notes(headlines, seed=123)
    prompts = [trading_note_messages(r["title"], r["summary"]) for r in rows]
    sampler = model_backend.load()
    groups = sampler.sample(
        prompts, rollouts, SamplingConfig(max_new_tokens=max_new_tokens), seeds=list(range(headlines))
    )
    examples = []
    for prompt, group in zip(prompts, groups):
        adv = group_advantages([structure_score(s.text) + 0.01 * k for k, s in enumerate(group)])
        examples += [GSPOExample(prompt, s.token_ids, s.logprobs, float(a)) for s, a in zip(group, adv)]
    tokens = sum(len(e.response_ids) for e in examples)

    def timed(one_at_a_time: bool, share_prompt_prefix: bool = True) -> tuple[float, int]:
        best = float("inf")
        for _ in range(repeats):
            policy = model_backend.load()
            torch.manual_seed(0)
            config = GSPOConfig(
                batch_size=batch_size,
                one_at_a_time=one_at_a_time,
                share_prompt_prefix=share_prompt_prefix,
                temperature=0.8,
            )
            started = time.perf_counter()
            stats = train_gspo(policy, examples, config)
            best = min(best, time.perf_counter() - started)
        return best, stats.steps

    batched_s, batched_steps = timed(False)
    unshared_s, _ = timed(False, share_prompt_prefix=False)
    single_s, single_steps = timed(True)
    summary = dict(
        benchmark="gspo_batching",
        examples=len(examples),
        response_tokens=tokens,
        batch_size=batch_size,
        padded_minibatches_s=round(batched_s, 2),
        padded_steps=batched_steps,
        padded_no_prefix_sharing_s=round(unshared_s, 2),
        speedup_no_prefix_sharing=round(single_s / unshared_s, 2),
        one_at_a_time_s=round(single_s, 2),
        one_at_a_time_steps=single_steps,
        speedup=round(single_s / batched_s, 2),
        tokens_per_s_batched=round(tokens / batched_s, 1),
        tokens_per_s_single=round(tokens / single_s, 1),
        torch_threads=torch.get_num_threads(),
        mean_response_tokens=round(float(np.mean([len(e.response_ids) for e in examples])), 1),
    )
    print(
        f"{len(examples)} examples ({tokens} response tokens): padded minibatches of {batch_size} "
        f"{batched_s:.2f}s vs one at a time {single_s:.2f}s -> {summary['speedup']}x"
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--headlines", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per way (the best counts)")
    add_record_argument(parser)
    args = parser.parse_args()
    result = run(args.headlines, args.rollouts, args.batch_size, args.max_new_tokens, args.repeats)
    finish("gspo_batching", result, args.record)


if __name__ == "__main__":
    main()
