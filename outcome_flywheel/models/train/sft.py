"""Completion-only supervised fine-tuning with LoRA, written once for torch and mlx (settings and
examples: `sft_config.SFTConfig`, `sft_config.SFTExample`).

The trainer body is here: the seeded LoRA init (kept when the policy already carries an adapter:
the curriculum's phases train the same weights), the tokenisation (prompt + prefix as context,
the completion as the response) and the batching plan. The framework lends its log-prob function
(`backend.batch_logprobs`, which returns log-probs of response tokens only, so prompt tokens never
enter the loss), its loss (`sft_loss` in `torch/losses.py` / `mlx/losses.py`) and its loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from outcome_flywheel.models.interface import ModelBackend, TrainStats
from outcome_flywheel.models.train.adapter import lora_adapter
from outcome_flywheel.models.train.batching import batch_plan
from outcome_flywheel.models.train.memory import ForwardCosts, forward_tokens
from outcome_flywheel.models.train.shards import announce, ranks, train_budgeted

if TYPE_CHECKING:
    from outcome_flywheel.models.train.sft_config import SFTConfig, SFTExample


def encode_sft(
    backend: ModelBackend, examples: Sequence["SFTExample"], max_completion_tokens: int
) -> tuple[list, list]:
    """(context ids, completion ids) per example: the chat prompt plus the prefix; the completion
    (cut to `max_completion_tokens`) with the end-of-turn token when `end_turn`."""
    contexts, completions = [], []
    for ex in examples:
        context = list(backend.prompt_ids(ex.prompt)) + (list(backend.text_ids(ex.prefix)) if ex.prefix else [])
        target = list(backend.encode_response(ex.completion)) if ex.end_turn else list(backend.text_ids(ex.completion))
        if not target:
            raise ValueError("an SFT example has an empty completion")
        contexts.append(context)
        completions.append(target[:max_completion_tokens])
    return contexts, completions


def sft_batch_loss(backend: ModelBackend, contexts, completions, idx: Sequence[int]):
    """The framework's `(loss, metrics)` of examples `idx`: mean NLL over their completion tokens."""
    logp, mask = backend.batch_logprobs([contexts[i] for i in idx], [completions[i] for i in idx])
    return backend.framework.sft_loss(logp, mask)


def train_sft(backend: ModelBackend, examples: Sequence["SFTExample"], config: "SFTConfig") -> TrainStats:
    """LoRA SFT on `backend`; adds a fresh adapter if it has none (else trains the one it has)."""
    ranks(backend.framework)  # data parallel under torchrun (shards.py); mlx refuses several, before any work
    announce("sft", backend, examples, config)  # a step's other ranks join this training (shards.py)
    backend.prepare_for_training(keep_moments=False)
    if not examples:
        raise ValueError("no SFT examples to train on")
    fw = backend.framework
    fw.seed(int(config.seed))
    adapter, adapter_differs = lora_adapter(backend, config.lora, "LoRA already on the model")  # before add_lora
    backend.add_lora(config.lora)
    contexts, completions = encode_sft(backend, examples, config.max_completion_tokens)

    def loss(model, idx: list[int]):
        return sft_batch_loss(backend, contexts, completions, idx)

    plan = batch_plan(range(len(examples)), config.batch_size, config.epochs, config.seed, group_by_prompt=False)
    # Within the memory budget (memory.py): a part's loss is the mean over its own completion tokens,
    # scaled by its share of the minibatch's, so the parts add up to the minibatch's token mean.
    share = lambda i: len(completions[i])  # noqa: E731

    def cost_at(costs: ForwardCosts):
        def cost(part: list[int]) -> float:  # one row an example, its context run whole
            return forward_tokens([contexts[i] for i in part], [len(completions[i]) for i in part], *costs)

        return cost

    stats = train_budgeted(backend, plan, loss, cost_at, share, False, config.learning_rate, config.max_grad_norm)
    stats.extra["config"] = config.as_dict()
    stats.extra["n_examples"] = len(examples)
    stats.extra["lora_adapter"], stats.extra["lora_settings_ignored"] = adapter, adapter_differs
    stats.extra["completion_tokens"] = sum(len(c) for c in completions)
    return stats
