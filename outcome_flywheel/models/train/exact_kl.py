"""The exact KL anchor on the call's name (`GSPOConfig.kl_estimator` exact, `kl_span` ticker), written once for
torch and mlx: KL(pi_theta || pi_ref) summed over the whole vocabulary at each of the name's positions, pi_ref the
base (the adapter off). Schulman's k3 sees the sampled name only, and its pull on a name the policy pushed far
below the base grows as exp(log pi_ref - log pi); the exact sum also sees the names the policy raised but did not
sample there (tiny-local's held-out notes drifted to names frequent in training, docs/daily_rl.md)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from outcome_flywheel.models.interface import ModelBackend
from outcome_flywheel.models.train.batching import EncodedExample


def named(batch: Sequence[EncodedExample]) -> list[EncodedExample]:
    """The examples whose call names a symbol (`name_mask` with a True): the only ones the anchor covers."""
    return [b for b in batch if names_a_symbol(b)]


def names_a_symbol(example: EncodedExample) -> bool:
    return bool(example.name_mask and any(example.name_mask))


def exact_kl_term(
    backend: ModelBackend,
    batch: Sequence[EncodedExample],
    beta: float,
    temperature: float,
    normaliser: float,
    policy_hidden: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """beta * sum_n KL_n / Z over the name positions of the batch's named examples (`fw.exact_kl_loss`); Z = the
    minibatch's normaliser. `policy_hidden`: the policy's final hidden states at every response position of the
    batch (the step's own forward, `batch_logprobs_hidden`), so that only the base forwards again (its rows take
    no gradient); None = the policy forwards the named notes once more. Metric kl: the mean KL_n."""
    fw = backend.framework
    if fw.exact_kl_loss is None:
        raise ValueError(f"the {fw.name} framework has no exact_kl_loss for kl_estimator 'exact'")
    rows = named(batch)
    if not rows:  # no name in this part: a zero term with the metric's key. A scalar, not an empty array's sum:
        zero = fw.as_array(backend, np.zeros((), dtype=np.float32))  # with that, mlx's eval hung once in ~10 runs
        return zero, {"kl": zero}
    covered = np.array([m for b in rows for m in b.name_mask], dtype=bool)  # one per response token (batching)
    if policy_hidden is not None:  # the named notes' name positions among the whole batch's response tokens
        at = np.concatenate(
            [np.asarray(b.name_mask if names_a_symbol(b) else [False] * len(b.response_ids), bool) for b in batch]
        )
        policy_hidden = policy_hidden[fw.as_array(backend, np.flatnonzero(at).astype(np.int32))]
    kl = backend.position_kl(
        [b.prompt_ids for b in rows], [b.response_ids for b in rows], covered, temperature, policy_hidden
    )
    return fw.exact_kl_loss(kl, beta, normaliser)
