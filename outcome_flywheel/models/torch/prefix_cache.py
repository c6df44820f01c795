"""A shared prompt's keys and values as the response rows of a teacher-forced forward read them,
and as its own forward makes them.

`TorchBackend.shared_prefix_logprobs` runs each distinct prompt once with a cache, then every
response on top of its prompt. Handed transformers' own cache, the responses' forward would grow it
at every layer (`DynamicLayer.update` concatenates and stores): keys and values of every row's prompt
and response, alive until the forward returns, 2 x (key-value width) values a position and layer
beyond what autograd keeps. On an H200 they were the only cost of a budgeted GSPO step's peak that
`models/train/memory.py` did not count (0.63 GiB of 7.4 at 8 rows of 712 positions on qwen3-0.6b).
Here each layer's update returns its prompt rows (gathered per response, differentiably) with the
new keys and values appended and stores nothing, so the concatenation lives only while the layer's
attention reads it (or as long as attention itself keeps it for the backward, which the count has).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


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
