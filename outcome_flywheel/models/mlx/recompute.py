"""Activation recomputation (gradient checkpointing, Chen et al. 2016): the mirror of
`torch/recompute.py`. Within `recomputing`, each decoder layer of the training forward runs under
`mlx.nn.utils.checkpoint` (as mlx-lm's `grad_checkpoint` does for its trainer), so `value_and_grad`
keeps the layer's inputs and recomputes its activations in the backward pass.

MLX calls a module through its class (`__call__` is looked up on the type), so the layers' class is
patched for the duration, as mlx-lm patches it; only the layers of this backend's model are
checkpointed (another model of the same class calls through unchanged), and the class is restored
after. A layer with a KV cache (sampling) runs unchanged: the teacher-forced forward has none.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import mlx.nn as nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an mlx-lm model (`model.model.layers`)."""
    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder layers at .model.layers to recompute")
    return list(layers)


@contextlib.contextmanager
def recomputing(backend: Any, on: bool = True) -> Iterator[None]:
    """Within: `backend.model`'s decoder layers recompute their activations in the backward pass
    (module docstring); their class restored after. A no-op when not `on`."""
    if not on:
        yield
        return
    layers = decoder_layers(backend.model)
    chosen = {id(layer) for layer in layers}
    originals = {cls: cls.__call__ for cls in {type(layer) for layer in layers}}
    for cls, original in originals.items():
        cls.__call__ = _recomputed_call(original, chosen)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.__call__ = original


def _recomputed_call(original, chosen: set[int]):
    @functools.wraps(original)
    def call(layer, x, mask=None, cache=None, **kwargs):
        if id(layer) not in chosen or cache is not None or kwargs:  # sampling, or a layer this does not know
            return original(layer, x, mask, cache, **kwargs)
        return nn.utils.checkpoint(layer, functools.partial(original, layer))(x, mask)

    return call
