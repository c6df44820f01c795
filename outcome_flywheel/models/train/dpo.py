"""Outcome-weighted DPO with LoRA, written once for torch and mlx (settings and pairs:
`dpo_config.WeightedDPOConfig`, `dpo_config.PreferencePair`).

The trainer body is here: the seeded LoRA init, the completions' segments, the reference
log-probs (the base, adapter off, once before any update; shared out across data-parallel ranks), the batching plan (`batching.batch_plan`
over single pairs) and the dataset's mean weight that every minibatch is normalised by. The
framework supplies only its log-prob function (`backend.sequence_logps`), its loss
(`weighted_dpo_loss` in `torch/losses.py` / `mlx/losses.py`) and its loop (`train` in
`torch/training.py` / `mlx/training.py`), through `backend.framework`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from outcome_flywheel.models.interface import ModelBackend, TrainStats
from outcome_flywheel.models.segments import encode_segments
from outcome_flywheel.models.train.adapter import lora_adapter
from outcome_flywheel.models.train.batching import batch_plan
from outcome_flywheel.models.train.memory import ForwardCosts, forward_tokens
from outcome_flywheel.models.train.shards import announce, gather, ranks, train_budgeted

if TYPE_CHECKING:
    from outcome_flywheel.models.train.dpo_config import PreferencePair, WeightedDPOConfig


def train_weighted_dpo(
    backend: ModelBackend, pairs: Sequence["PreferencePair"], config: "WeightedDPOConfig"
) -> TrainStats:
    """LoRA weighted DPO on `backend`; adds a fresh adapter if it has none."""
    rank, world = ranks(backend.framework)  # data parallel under torchrun (shards.py); mlx refuses several
    announce("dpo", backend, pairs, config)  # a step's other ranks join this training (shards.py)
    backend.prepare_for_training(keep_moments=False)
    if not pairs:
        raise ValueError("no preference pairs to train on")
    if any(p.weight <= 0 for p in pairs):
        raise ValueError("pair weights must be positive (swap chosen/rejected for a negative outcome weight)")
    fw = backend.framework
    fw.seed(int(config.seed))  # the LoRA init draws from the framework's generator
    adapter, adapter_differs = lora_adapter(backend, config.lora, "LoRA already on the model")  # before add_lora
    backend.add_lora(config.lora)
    prompt_ids = [backend.prompt_ids(p.prompt) for p in pairs]
    chosen_ids = [encode_segments(backend.encode_response, p.chosen, config.completion_unit) for p in pairs]
    rejected_ids = [encode_segments(backend.encode_response, p.rejected, config.completion_unit) for p in pairs]
    weights = np.array([float(p.weight) for p in pairs], dtype=np.float32)
    mean_weight = float(weights.mean())
    ref_chosen, ref_rejected, reference_passes = reference_logps(
        backend, prompt_ids, chosen_ids, rejected_ids, config.reference_batch_size, rank, world
    )

    def loss(model, idx: list[int]):
        p = [prompt_ids[i] for i in idx]
        # Chosen and rejected in one forward pass.
        logps = backend.sequence_logps(p + p, [chosen_ids[i] for i in idx] + [rejected_ids[i] for i in idx])
        n = len(idx)
        return fw.weighted_dpo_loss(
            logps[:n],
            logps[n:],
            fw.as_array(backend, ref_chosen[idx]),
            fw.as_array(backend, ref_rejected[idx]),
            fw.as_array(backend, weights[idx]),
            config.beta,
            mean_weight,
        )

    plan = batch_plan(range(len(pairs)), config.batch_size, config.epochs, config.seed, group_by_prompt=False)

    # Within the memory budget (memory.py): a pair's forward holds a row per segment of its chosen and
    # of its rejected completion (each line with `completion_unit="line"`), all on its prompt; a part's
    # loss is over its own pairs (n_part x mean weight), scaled by n_part / n, so the parts add up to
    # the minibatch's loss.
    def cost_at(costs: ForwardCosts):
        def cost(part: list[int]) -> float:
            rows = [(prompt_ids[i], segment) for i in part for segment in (*chosen_ids[i], *rejected_ids[i])]
            return forward_tokens([p for p, _ in rows], [len(segment) for _, segment in rows], *costs)

        return cost

    stats = train_budgeted(
        backend, plan, loss, cost_at, lambda i: 1.0, True, config.learning_rate, config.max_grad_norm
    )
    stats.extra["reference_batches_by_rank"] = gather(fw, reference_passes)
    stats.extra["config"] = config.as_dict()
    stats.extra["n_pairs"] = len(pairs)
    stats.extra["lora_adapter"], stats.extra["lora_settings_ignored"] = adapter, adapter_differs
    return stats


def reference_logps(
    backend: ModelBackend, prompt_ids, chosen_ids, rejected_ids, batch_size: int, rank: int = 0, world: int = 1
) -> tuple[np.ndarray, np.ndarray, int]:
    """`[N]` float32 log ref(chosen | prompt) and log ref(rejected | prompt): the base (adapter off), no
    gradients, `batch_size` pairs at a time (chosen and rejected in separate passes), and how many of
    those batches this rank computed. With several ranks, batch k is rank k mod world's and every rank
    gathers all of them: the same batches as one process, so the same values, at 1/world of the work."""
    fw = backend.framework
    n = len(prompt_ids)
    starts = list(range(0, n, batch_size))
    mine = {}
    with fw.inference(backend), backend.adapter_disabled():
        for start in starts[rank::world]:
            sl = slice(start, start + batch_size)
            mine[start] = (
                fw.to_numpy(backend.sequence_logps(prompt_ids[sl], chosen_ids[sl])),
                fw.to_numpy(backend.sequence_logps(prompt_ids[sl], rejected_ids[sl])),
            )
    batches = {start: values for part in gather(fw, mine) for start, values in part.items()}
    if sorted(batches) != starts:
        raise RuntimeError(f"data parallel: reference batches {sorted(set(starts) - set(batches))} computed by no rank")
    ref_chosen = np.empty(n, dtype=np.float32)
    ref_rejected = np.empty(n, dtype=np.float32)
    for start, (chosen, rejected) in batches.items():
        ref_chosen[start : start + len(chosen)] = chosen
        ref_rejected[start : start + len(rejected)] = rejected
    return ref_chosen, ref_rejected, len(mine)
