"""The bytes of live tensors, op by op, on any device (the CPU here): what a caching allocator's
peak statistic gives on CUDA, without one. A `TorchDispatchMode` sees every op's outputs; a
storage made inside the mode counts until the last tensor on it is gone (a weak reference to the
storage), and the largest sum seen is the peak. Storages that existed before (the model's weights
and buffers, passed in) are left out: the peak is what the code under the mode added. What it cannot
see: a kernel's own scratch memory that never becomes an op's output (cuBLAS's workspace, a fused
kernel's buffers), which the CUDA case of test_training_peak.py bounds by the allocator's peak."""

from __future__ import annotations

from typing import Iterable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    def __init__(self, existing: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.existing = {t.untyped_storage().data_ptr() for t in existing}
        self.live: dict[tuple[int, int], tuple[StorageWeakRef, int]] = {}
        self.upper = 0  # the bytes in `live`, freed storages included until the next sweep: never below the truth
        self.peak = 0
        self.peak_op = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key[0] in self.existing:
                continue
            held = self.live.get(key)
            if held is None or held[0].expired():
                self.upper += storage.nbytes() - (held[1] if held else 0)
                self.live[key] = (StorageWeakRef(storage), storage.nbytes())
        # Sweeping the freed storages costs a pass over every live one, so it runs only when the bound
        # passes the peak: below it the true total is below too, and the peak stays exact.
        if self.upper > self.peak:
            for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
                self.upper -= self.live.pop(key)[1]
            if self.upper > self.peak:
                self.peak, self.peak_op = self.upper, str(func)
        return out
