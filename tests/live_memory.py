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
            if key not in self.live or self.live[key][0].expired():
                self.live[key] = (StorageWeakRef(storage), storage.nbytes())
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            del self.live[key]
        total = sum(size for _, size in self.live.values())
        if total > self.peak:
            self.peak, self.peak_op = total, str(func)
        return out
