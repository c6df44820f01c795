"""A shared prompt's keys and values as the response rows of a teacher-forced forward read them,
and as its own forward makes them.

`TorchBackend.batch_logprobs(shared_prefix=True)` runs each distinct prompt once with a cache, then every
response on top of its prompt (`shared_prefix_hidden`). Handed transformers' own cache, the
responses' forward would grow it at every layer (`DynamicLayer.update` concatenates and stores):
keys and values of every row's prompt and response, alive until the forward returns, 2 x
(key-value width) values a position and layer beyond what autograd keeps. On an H200 they were the
only cost of a budgeted GSPO step's peak that `models/train/memory.py` did not count (0.63 GiB of
7.4 at 8 rows of 712 positions on qwen3-0.6b). Here each layer's update returns its prompt rows
(gathered per response, differentiably) with the new keys and values appended and stores nothing,
so the concatenation lives only while the layer's attention reads it (or as long as attention
itself keeps it for the backward, which the count has).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from outcome_flywheel.models.torch.sampling import left_padded


class PromptPrefixCache(Cache):
    """The prompt cache's layers, read by `rows` (row b of the forward reads prompt `rows[b]`), never
    grown. One forward's worth: its length stays the prompt's, as the mask of that forward expects."""

    def __init__(self, prompt_cache: Cache, rows: torch.Tensor):
        super().__init__(layers=list(prompt_cache.layers))
        self.rows = rows

    @staticmethod
    def applies_to(cache: Cache) -> bool:
        """Only plain full-attention layers: a sliding window's layer keeps a cropped cache."""
        layers = getattr(cache, "layers", None)
        return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        keys = torch.cat([layer.keys.index_select(0, self.rows), key_states], dim=-2)
        values = torch.cat([layer.values.index_select(0, self.rows), value_states], dim=-2)
        return keys, values


class PromptForwardCache(DynamicCache):
    """A shared prompt's own forward, from an empty cache: transformers' cache, except that a layer
    run again (its activations recomputed in the backward pass, `recompute.py`) gets back the keys
    and values it has just made instead of appending them a second time. The stored ones, which
    the responses read, stay the forward's. Each layer is updated once by the forward, so a second
    update of a layer is the recomputation."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if layer_idx < len(self.layers) and self.layers[layer_idx].is_initialized:
            return key_states, value_states  # the prompt's forward starts empty: what the first update returned
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def shared_prefix_hidden(backend, prompt_ids, response_ids) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Final hidden states predicting every response token `[B, T, H]`, the responses and their mask,
    for `backend` (a `TorchBackend`): each distinct prompt run once, left-padded, then the responses
    on top of it, right-padded (invisible to real tokens under causal attention)."""
    inner, device, pad = backend._causal_lm().model, backend.device, backend.tokenizer.pad_token_id
    unique: dict[tuple[int, ...], int] = {}
    rows = [unique.setdefault(tuple(p), len(unique)) for p in prompt_ids]
    ids, attention, positions = left_padded(list(unique), pad, device)
    cache = PromptForwardCache(config=inner.config)
    read = PromptPrefixCache.applies_to(cache)  # else a sliding window's layers: transformers' cache, grown
    if not read:
        cache = DynamicCache(config=inner.config)
    out = inner(input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True)
    index = torch.tensor(rows, device=device)
    first = out.last_hidden_state[:, -1, :].index_select(0, index)  # predicts each response's first token
    if read:  # each layer gathers its prompt rows; nothing is stored
        cache = PromptPrefixCache(cache, index)
    else:
        cache.batch_select_indices(index)

    length = max(len(r) for r in response_ids)
    responses = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for b, r in enumerate(response_ids):
        responses[b, : len(r)] = torch.tensor(list(r))
        mask[b, : len(r)] = True
    responses, mask = responses.to(device), mask.to(device)
    if length == 1:
        return first[:, None, :], responses, mask
    full_attention = torch.cat([attention.index_select(0, index), torch.ones_like(responses)], dim=-1)
    response_positions = positions[:, -1:].index_select(0, index) + 1 + torch.arange(length, device=device)[None, :]
    rest = inner(
        input_ids=responses[:, :-1],
        attention_mask=full_attention[:, :-1],
        position_ids=response_positions[:, :-1],
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    return torch.cat([first[:, None, :], rest], dim=1), responses, mask
