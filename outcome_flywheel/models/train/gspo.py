"""The daily loop's policy update, written once for torch and mlx (settings and the objectives'
formulas: `gspo_config.GSPOConfig`): the token objective (span-scoped parts per token, the whole-note
part through GSPO's sequence ratio), GSPO, or the reward-weighted log-likelihood.

The trainer body is here: the batching plan (`batching.gspo_minibatches`), the adapter or master
weights, the choice of pi_old and the statistics. The framework supplies only its log-prob function
(`backend.batch_logprobs`, at the rollouts' sampling temperature), its loss (`gspo_loss` in
`torch/losses.py` / `mlx/losses.py`) and its loop (`train` in `torch/training.py` /
`mlx/training.py`), through `backend.framework`.

pi_old is the behaviour policy: the checkpoint that generated the rollouts (the caller checks their
`policy_version`), unchanged since. By default (`old_logprobs="recompute"`) it is evaluated by one
no-grad pass of the training forward before the first update, so s_i = 1 exactly at the first
step; the log-probs stored at generation (`GSPOExample.behavior_logprobs`, at the same T) must agree
with it and the largest per-sequence gap is reported (`behavior_logprob_gap_max`). At s_i = 1 the
gradient is exactly that of `-A_i * mean_t log pi_theta` (objective "reward_weighted").

The LoRA init draws from the framework's global generator, which the caller seeds
(`backend.framework.seed`); `config.seed` shuffles the minibatches. pi_ref of the KL term is the
base (the adapter switched off), evaluated in the same no-grad pass as pi_old. AdamW's moments come
from the parent checkpoint when it saved them (`ModelBackend.optimizer_tensors`) and are handed back
for the day's checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from outcome_flywheel.models.interface import Accumulated, ModelBackend, TrainStats
from outcome_flywheel.models.train.adapter import lora_adapter
from outcome_flywheel.models.train.batching import EncodedExample, epoch_sizes, gspo_minibatches, padded, shares_prefix
from outcome_flywheel.models.train.counterfactual import counterfactual_term, other_rows, side_leans
from outcome_flywheel.models.train.exact_kl import exact_kl_term
from outcome_flywheel.models.train.memory import ForwardCosts, forward_tokens, memory_plan, split_by_cost
from outcome_flywheel.models.train.shards import announce, gather, plan_figures, ranks, shard

if TYPE_CHECKING:
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample

LogprobFn = Callable[[Sequence[EncodedExample]], tuple[Any, Any]]


def train_gspo(backend: ModelBackend, examples: Sequence["GSPOExample"], config: "GSPOConfig") -> TrainStats:
    """`config.epochs` passes over `examples` in padded minibatches, one AdamW step each.

    Adds a fresh LoRA adapter when `config.lora` is set and the policy has none (the first trained
    day); with `lora=None` every weight trains, in fp32 (`use_master_weights`).
    """
    rank, world = ranks(backend.framework)  # data parallel under torchrun (shards.py); mlx refuses several
    announce("gspo", backend, examples, config)  # a step's other ranks join this training (shards.py)
    backend.prepare_for_training(keep_moments=True)
    fw = backend.framework
    batches = gspo_minibatches(examples, config, backend.prompt_ids)  # validates before any change
    adapter, adapter_differs = lora_adapter(backend, config.lora)  # before a fresh one is added
    if config.lora is not None and not backend.has_adapter:
        backend.add_lora(config.lora)
    elif config.lora is None and not backend.has_adapter:
        backend.use_master_weights()  # fp32 weights: small steps are not rounded away
    share = shares_prefix(config)

    def forward(batch: Sequence[EncodedExample]):
        """(logp, mask, the final hidden states): the exact anchor reads the policy's from this forward."""
        logp, mask, hidden = backend.batch_logprobs_hidden(
            [b.prompt_ids for b in batch], [b.response_ids for b in batch], config.temperature, shared_prefix=share
        )
        if config.frozen_span == "ticker" and any(b.name_mask for b in batch):  # no part trains the names
            names = padded([b.name_mask or [] for b in batch], max(len(b.response_ids) for b in batch))
            mask = mask * fw.as_array(backend, 1.0 - names)
        return logp, mask, hidden

    def logprobs(batch: Sequence[EncodedExample]):
        return forward(batch)[:2]

    # This rank's shard of each minibatch (whole prompt groups, shards.py), within the memory budget in
    # parts whose gradients add up to its own (memory.py)
    mine = [shard(batch, [tuple(b.prompt_ids) for b in batch], rank, world) for batch in batches]
    # pi_ref for the KL term: the base, i.e. the adapter switched off (a full fine-tune holds no base). k3 reads
    # it from the no-grad pass below; the exact anchor runs it (no grad) beside each step's forward, whose hidden
    # states give the policy's side of the KL (exact_kl.py).
    # Frozen names (`frozen_span` ticker) take no KL either: a KL on the ticker alone then has nothing to act on.
    frozen_anchor = config.frozen_span == "ticker" and config.kl_span == "ticker"
    with_reference = config.kl_beta > 0 and backend.has_adapter and not frozen_anchor
    exact = with_reference and config.kl_estimator == "exact"
    memory = memory_plan(backend, mine, part_tokens, share)
    parts_of = [split_by_cost(own, part_tokens(memory.costs), memory.limit) for own in mine]
    micros = [part for parts in parts_of for part in parts]
    recompute = config.old_logprobs == "recompute" or (
        config.old_logprobs == "auto" and not computes_in_float32(backend)
    )
    eps_low, eps_high = config.clip_band()
    if config.objective != "token" and any(not per_sequence_advantage(b) for batch in batches for b in batch):
        raise ValueError(
            f"objective {config.objective!r} takes one advantage per note, but some examples have span-scoped "
            "token advantages (price / relevance judge the call's line): use objective 'token'"
        )
    counterfactual = any(b.counterfactual is not None for batch in batches for b in batch)
    if counterfactual and config.objective != "token":
        raise ValueError(f"the counterfactual term trains with objective 'token', not {config.objective!r}")
    k3 = with_reference and not exact
    old_by_batch, behavior_gaps, is_ratios, ref_by_batch = old_logprobs(backend, micros, logprobs, recompute, k3)
    if world > 1:  # the statistics over every rank's examples
        gathered = gather(fw, (behavior_gaps, is_ratios))
        behavior_gaps = [g for gaps, _ in gathered for g in gaps]
        is_ratios = {i: r for _, ratios in gathered for i, r in ratios.items()}
    leans = side_leans(backend, config, examples, micros, old_by_batch, logprobs) if counterfactual else None
    tis = config.tis_cap is not None and recompute  # with stored pi_old the IS ratio is 1 by construction
    behavior_by_batch = (
        [
            fw.as_array(backend, padded([b.behavior_logprobs for b in batch], max(len(b.response_ids) for b in batch)))
            for batch in micros
        ]
        if tis
        else [None] * len(micros)
    )
    # `kl_span` ticker: the KL term on the call's named symbol only (notes that name none take no KL)
    kl_masks = [
        fw.as_array(backend, padded([b.name_mask or [] for b in batch], max(len(b.response_ids) for b in batch)))
        if k3 and config.kl_span == "ticker"
        else None
        for batch in micros
    ]
    # Dr. GRPO's constant normaliser: every minibatch divides by its sequences x the update's longest response.
    longest = max((b.length for batch in batches for b in batch), default=1)  # sampled, before any trim

    # The trust region of the span parts: the epoch each part belongs to, and whether it still trains them.
    per_epoch = max(1, len(batches) // max(1, int(config.epochs)))
    minibatch_of = [k for k, parts in enumerate(parts_of) for _ in parts]
    span_on = [config.span_epochs is None or k // per_epoch < int(config.span_epochs) for k in minibatch_of]
    term_on = [counterfactual and k // per_epoch < int(config.counterfactual_epochs) for k in minibatch_of]
    # Each part's advantages x Z / Z_part under `per_part` (1 under `shared`), from the whole minibatch
    scales = [part_scales(batch, longest, config.part_normaliser) for batch in batches]

    def loss(model, indexed_batch):  # a part of a minibatch: its loss as a whole minibatch's (scaled by the caller)
        index, batch = indexed_batch
        logp, mask, hidden = forward(batch)
        if config.objective == "token":  # span-scoped parts per token, the whole-note part per sequence
            parts = GRADIENT_PARTS if span_on[index] else ("note",)
            rows, sequence = part_advantages(batch, scales[minibatch_of[index]], parts)
            value, metrics = fw.gspo_loss(
                logp,
                old_by_batch[index],
                mask,
                fw.as_array(backend, rows),
                eps_low,
                eps_high,
                "token",
                behavior_by_batch[index],
                config.tis_cap if tis else None,
                ref_by_batch[index],
                config.kl_beta if k3 else 0.0,
                float(len(batch) * longest),
                fw.as_array(backend, sequence),
                (config.sequence_epsilon_low, config.sequence_epsilon_high),
                kl_masks[index],
            )
            if counterfactual:  # every step reports the term (0 outside its epochs), so the metrics line up
                lean = leans[index] if leans else None  # the lean anchor and target (counterfactual.side_leans)
                term, term_metrics = counterfactual_term(
                    backend, batch, logp, logprobs, len(batch) * longest, term_on[index], config.counterfactual_form, lean
                )  # fmt: skip
                value, metrics = value + term, {**metrics, **term_metrics}
        else:
            value, metrics = fw.gspo_loss(
                logp,
                old_by_batch[index],
                mask,
                fw.as_array(backend, np.array([b.advantage for b in batch], dtype=np.float32)),
                eps_low,
                eps_high,
                config.objective,
                behavior_by_batch[index],
                config.tis_cap if tis else None,
                ref_by_batch[index],
                config.kl_beta if k3 else 0.0,
                kl_mask=kl_masks[index],
            )
        if exact:  # the anchor on the names, under Dr. GRPO's constant normaliser whatever the objective
            term, term_metrics = exact_kl_term(
                backend, batch, config.kl_beta, config.temperature, len(batch) * longest, policy_hidden=hidden
            )
            value, metrics = value + term, {**metrics, **term_metrics}
        return value, metrics

    # Each part's pull, measured in one process (data parallel: each rank forwards its shard only, so the probe,
    # a minibatch of its own, is not taken there; the day's row then has NaN shares)
    shares = (
        gradient_shares(backend, examples_of(batches, config.epochs), config, logprobs, longest, memory)
        if batches
        and config.gradient_shares
        and config.objective == "token"
        and fw.gradient_norm is not None
        and world == 1
        else {}
    )
    stats = TrainStats()
    if batches:
        optimizer = fw.adamw(backend.model, config.learning_rate)
        moments = resume_moments(backend, optimizer)
        with backend.recomputing(memory.recompute):
            stats = fw.train(
                backend.model,
                optimizer,
                loss=loss,
                iterate_batches=indexed_steps(batches, parts_of),
                max_grad_norm=config.max_grad_norm,
            )
        stats.extra["optimizer_moments"] = moments
        if fw.optimizer_state is not None:  # saved with the checkpoint: the next day continues from them
            backend.optimizer_tensors = fw.optimizer_state(optimizer, backend.model)
    stats.extra.update(shares)
    stats.extra["lora_adapter"], stats.extra["lora_settings_ignored"] = adapter, adapter_differs
    stats.extra["old_logprobs"] = "recomputed" if recompute else "stored"
    if with_reference:
        reference = "base (adapter off)" + ("; on the call's ticker only" if config.kl_span == "ticker" else "")
        reference += "; exact over the vocabulary" if exact else ""
    elif not config.kl_beta:
        reference = "none: kl_beta = 0"
    elif frozen_anchor:
        reference = "none: the names it would cover are frozen (frozen_span ticker)"
    else:
        reference = "none: a full fine-tune holds no base model in memory"
    stats.extra["kl_reference"] = reference
    if behavior_gaps:
        # How far the sampler's stored log-probs sit from the training forward (per-sequence mean).
        stats.extra["behavior_logprob_gap_max"] = float(max(behavior_gaps))
    if is_ratios:
        # Per example (by its position in `examples`): exp(mean_t(log pi_old - log pi_behaviour)), before truncation.
        stats.extra["is_ratio_by_example"] = [is_ratios.get(i, float("nan")) for i in range(len(examples))]
    stats.extra.update(epoch_sizes(batches, config.epochs))
    stats.extra.update(plan_figures(fw, len(micros), memory, world))
    return stats


def indexed_steps(
    batches: Sequence[Sequence[EncodedExample]], parts_of: Sequence[Sequence[Sequence[EncodedExample]]]
) -> list:
    """One optimiser step per minibatch: `(part index, part)` when it is whole, else its parts as an
    `Accumulated` step, each scaled by its share of the minibatch's sequences. A part's loss is the
    minibatch loss's form over its own sequences (means over sequences; the token sums over the
    part's sequences x the update's longest response, Dr. GRPO's normaliser), so the scaled sum is
    exactly the whole minibatch's loss, and its gradient the minibatch's. Data parallel: `parts_of` holds
    this rank's shard's parts only (none: an empty step), scaled alike, so the ranks' sum is the minibatch's."""
    steps, index = [], 0
    for batch, parts in zip(batches, parts_of):
        if len(parts) == 1 and len(parts[0]) == len(batch):
            steps.append((index, parts[0]))
        else:
            steps.append(
                Accumulated(
                    tuple((index + k, part) for k, part in enumerate(parts)),
                    tuple(len(part) / len(batch) for part in parts),
                )
            )
        index += len(parts)
    return steps


GRADIENT_PARTS = ("note", "relevance", "price")
SHARE_PARTS = (
    *GRADIENT_PARTS,
    "counterfactual",
)  # the gradient shares' parts: the span parts and the counterfactual term


def part_scales(batch: Sequence[EncodedExample], longest: int, normaliser: str) -> dict[str, float]:
    """The factor each part's advantages take in a minibatch so that its loss is divided by its own tokens
    (`per_part`): Z / Z_part, Z = the minibatch's sequences x the update's longest response (the loss's
    normaliser), Z_part = the tokens the part spans in the minibatch (`note`: the response tokens of the
    notes that carry it, the judged ones; `relevance` / `price`: the tokens with a span advantage of the notes
    that carry that part). A positive factor scales the clipped surrogate exactly (min(r cA, clip(r) cA) =
    c min(r A, clip(r) A)), so the clip is untouched. `shared`: 1 for every part."""
    if normaliser == "shared":
        return dict.fromkeys(GRADIENT_PARTS, 1.0)
    z = float(len(batch) * longest)
    tokens = dict.fromkeys(GRADIENT_PARTS, 0)
    for b in batch:
        if b.token_part != "price":  # a judged note: the whole-note part is on all its tokens
            tokens["note"] += b.length
        if b.token_advantages is not None:
            tokens[b.token_part] += sum(1 for a in b.token_advantages if a != 0.0)
    return {part: (z / n if n else 1.0) for part, n in tokens.items()}


def part_advantages(
    batch: Sequence[EncodedExample], scale: dict[str, float], parts: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """The token objective's advantages of a batch with only `parts` on: the span advantages [B, T] of the
    examples whose span part is on, and the whole-note advantages [B] when `note` is, each x its `part_scales`."""
    width = max(len(b.response_ids) for b in batch)
    rows = [
        [a * scale[b.token_part] for a in b.advantages_row()] if b.token_part in parts else [0.0] * len(b.response_ids)
        for b in batch
    ]
    sequence = [b.advantage * scale["note"] if "note" in parts else 0.0 for b in batch]
    return padded(rows, width), np.array(sequence, dtype=np.float32)


def examples_of(batches: Sequence[Sequence[EncodedExample]], epochs: int) -> list[EncodedExample]:
    """The first epoch's examples, by their position in the trainer's list (every epoch holds each once)."""
    per_epoch = max(1, len(batches) // max(1, int(epochs)))
    return sorted((b for batch in batches[:per_epoch] for b in batch), key=lambda b: b.index)


def gradient_shares(
    backend: ModelBackend,
    examples: Sequence[EncodedExample],
    config: "GSPOConfig",
    logprobs: LogprobFn,
    longest: int,
    memory,
) -> dict[str, float]:
    """Each reward part's pull on the weights before the first step: the gradient norm of the loss with
    only that part's advantages (`note` = the sequence part, `relevance` / `price` = the span parts of the
    notes that carry them, `counterfactual` = the counterfactual term (sides and names), where the probe holds notes that carry it), at
    ratio 1 (pi_old = the current policy) and under the update's normaliser, on a probe minibatch of up to
    `batch_size` examples taken at an even stride through the day's (so the mix of judged and matured notes is
    the day's). `grad_share_<part>` = its norm over the sum of the parts'."""
    fw = backend.framework
    stride = max(1, -(-len(examples) // max(1, config.batch_size)))
    probe = list(examples[::stride])
    if not probe:
        return {}
    pieces = split_by_cost(probe, part_tokens(memory.costs), memory.limit)
    scale = part_scales(probe, longest, config.part_normaliser)
    measured = [*GRADIENT_PARTS, *(["counterfactual"] if any(b.counterfactual is not None for b in probe) else [])]

    def only(part: str):
        def loss(model, piece):
            batch = piece
            logp, mask = logprobs(batch)
            if part == "counterfactual":
                return counterfactual_term(
                    backend, batch, logp, logprobs, float(len(batch) * longest), form=config.counterfactual_form
                )
            old = fw.as_array(backend, fw.to_numpy(logp).astype(np.float32))  # ratio 1, no gradient through it
            rows, sequence = part_advantages(batch, scale, (part,))
            return fw.gspo_loss(
                logp,
                old,
                mask,
                fw.as_array(backend, rows),
                *config.clip_band(),
                "token",
                normaliser=float(len(batch) * longest),
                sequence_advantages=fw.as_array(backend, sequence),
                sequence_clip=(config.sequence_epsilon_low, config.sequence_epsilon_high),
            )

        return loss

    step = pieces[0] if len(pieces) == 1 else Accumulated(tuple(pieces), tuple(len(p) / len(probe) for p in pieces))
    with backend.recomputing(memory.recompute):
        norms = {part: fw.gradient_norm(backend.model, only(part), step) for part in measured}
    total = sum(norms.values())
    out = {f"grad_norm_{k}": float(v) for k, v in norms.items()}
    out.update({f"grad_share_{k}": (float(v) / total if total > 0 else float("nan")) for k, v in norms.items()})
    return out


def part_tokens(costs: ForwardCosts) -> Callable[[list[EncodedExample]], float]:
    """A part's padded size in whole tokens (`memory.forward_tokens` at `costs`), with the rows its other terms
    forward with gradients: the counterfactual term's teacher-forced rows (the exact anchor's base forward keeps
    nothing for the backward pass, and its policy side is the part's own forward)."""

    def cost(part: list[EncodedExample]) -> float:
        rows = [*part, *other_rows(part)]
        return forward_tokens([b.prompt_ids for b in rows], [len(b.response_ids) for b in rows], *costs)

    return cost


def resume_moments(backend: ModelBackend, optimizer: Any) -> str:
    """Load the parent checkpoint's AdamW moments into the fresh optimizer (else its first step is
    lr * sign(g) on every weight); what happened, for the record."""
    fw = backend.framework
    tensors = backend.optimizer_tensors
    if tensors is None or fw.load_optimizer_state is None:
        return "fresh: the parent has none"
    try:
        fw.load_optimizer_state(optimizer, backend.model, tensors)
    except ValueError as err:  # another LoRA rank or target modules: the old moments do not apply
        return f"fresh: {err}"
    return f"resumed after {int(np.asarray(tensors['step']).reshape(()))} steps"


def per_sequence_advantage(example: EncodedExample) -> bool:
    """Whether the example has only a whole-note advantage (what `gspo` can train): no span-scoped part."""
    return example.token_advantages is None or not any(example.token_advantages)


def old_logprobs(
    backend: ModelBackend,
    batches: Sequence[Sequence[EncodedExample]],
    logprobs: LogprobFn,
    recompute: bool,
    reference: bool = False,
) -> tuple[list[Any], list[float], dict[int, float], list[Any]]:
    """pi_old of every minibatch, as the framework's arrays, the per-sequence mean gaps between
    the stored behaviour log-probs and the recomputed ones, each example's sequence IS ratio
    exp(mean_t(recomputed - stored)) by its index (both empty when not recomputed), and with
    `reference` pi_ref's log-probs (the adapter switched off; else None per minibatch).

    Recomputed: no-grad passes of the training forward, before any update (the policy has not
    moved yet, so this is pi_old); stored: the behaviour log-probs saved at generation. pi_old is one
    policy, so each example's is computed once, in the first (micro-)batch that holds it, which is
    the first epoch's arrangement, where its training forward sees the same batch and s_i = 1 exactly
    at the first step; later epochs reuse those values instead of a pass over the data each epoch.
    pi_ref (the base) is likewise one set of values per example."""
    fw = backend.framework
    old_rows: dict[int, np.ndarray] = {}
    ref_rows: dict[int, np.ndarray] = {}
    gaps: list[float] = []
    ratios: dict[int, float] = {}
    with fw.inference(backend):
        for batch in batches:
            new = [k for k, b in enumerate(batch) if b.index not in (old_rows if recompute else ref_rows)]
            if not new or not (recompute or reference):
                continue
            if reference:
                with backend.adapter_disabled():
                    ref, _ = logprobs(batch)
                ref = fw.to_numpy(ref).astype(np.float32)
                ref_rows.update({batch[k].index: ref[k, : len(batch[k].response_ids)] for k in new})
            if not recompute:
                continue
            old, mask = logprobs(batch)
            old, mask = fw.to_numpy(old).astype(np.float32), fw.to_numpy(mask)
            stored = padded([b.behavior_logprobs for b in batch], old.shape[1])
            signed = ((old - stored) * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
            for k in new:
                old_rows[batch[k].index] = old[k, : len(batch[k].response_ids)]
                gaps.append(float(abs(signed[k])))
                ratios[batch[k].index] = float(np.exp(signed[k]))

    def arrays(row_of: Callable[[EncodedExample], Sequence[float]]) -> list[Any]:  # a batch's rows, padded
        width = lambda batch: max(len(b.response_ids) for b in batch)  # noqa: E731
        return [fw.as_array(backend, padded([row_of(b) for b in batch], width(batch))) for batch in batches]

    old_by_batch = arrays(lambda b: old_rows[b.index] if recompute else b.behavior_logprobs)
    ref_by_batch = arrays(lambda b: ref_rows[b.index]) if reference else [None] * len(batches)
    return old_by_batch, gaps, ratios, ref_by_batch


def computes_in_float32(backend: ModelBackend) -> bool:
    """Whether the policy's forward runs in fp32 (`torch.float32`, `mlx.core.float32`)."""
    return str(backend.dtype).rsplit(".", 1)[-1] == "float32"
