"""What every model built here shares: the folder's tail (save, hash, `build_info.json`, publish
atomically), the fingerprint check that reuses a folder, and the per-machine cache under `.cache/`.

`tiny_local.py` and `smollm2.py` differ in how they make a model; from a model and a tokenizer in
memory to a published folder they are the same code, here.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from outcome_flywheel.storage import publish_dir

BUILD_INFO = "build_info.json"


def weights_sha256(model_dir: Path) -> str:
    """Hash of every tensor (name, dtype, shape, bytes) in the folder's safetensors files."""
    from safetensors.numpy import load_file

    digest = hashlib.sha256()
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        tensors = load_file(str(file))
        for name in sorted(tensors):
            arr = np.ascontiguousarray(tensors[name])
            digest.update(f"{name}|{arr.dtype}|{arr.shape}".encode())
            digest.update(arr.tobytes())
    return digest.hexdigest()


def read_build_info(model_dir: Path) -> dict | None:
    path = Path(model_dir) / BUILD_INFO
    return json.loads(path.read_text()) if path.exists() else None


def staged_folder(out_dir: Path, write: Callable[[Path], dict]) -> dict:
    """Run `write(staging)` (it fills a fresh folder beside `out_dir` and returns its build info),
    save that info as `build_info.json` and move the folder to `out_dir` whole, replacing an older
    one; a failure leaves `out_dir` as it was and no staging folder behind."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        info = write(staging)
        (staging / BUILD_INFO).write_text(json.dumps(info, indent=2))
        publish_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return info


def save_model_folder(
    out_dir: Path, model, tokenizer, info: dict, started: float, finish: Callable[[Path], None] | None = None
) -> dict:
    """The build tail of every local model: `save_pretrained` the model and tokenizer, `finish`
    the folder (a config fix-up), and publish it with `info` plus parameters, vocabulary size,
    build seconds (since `started`, a `perf_counter`) and the weights' hash. Returns the info."""

    def write(staging: Path) -> dict:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if finish is not None:
            finish(staging)
        return {
            **info,
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "vocab_size": len(tokenizer),
            "build_seconds": round(time.perf_counter() - started, 2),
            "weights_sha256": weights_sha256(staging),
        }

    return staged_folder(out_dir, write)


# Where `ensure_folder`'s model came from (the `base_model` asset's `build_source`).
EXISTING, PREBUILT, BUILT = "existing", "prebuilt", "built"


def ensure_folder(
    out_dir: Path,
    fingerprint: str,
    build: Callable[[Path], dict],
    rebuild: bool = False,
    prebuilt: Callable[[Path], dict | None] | None = None,
) -> tuple[dict, str]:
    """`(build info, where it came from)`: `existing` when `out_dir` already holds this fingerprint's build;
    else `prebuilt` when `prebuilt(out_dir)` put a verified build there (tiny-local's bundled one; None: it
    did not); else `built` by `build(out_dir)`. `rebuild` skips the first two and builds."""
    if not rebuild:
        info = read_build_info(out_dir)
        if info is not None and info.get("fingerprint") == fingerprint:
            return info, EXISTING
        info = prebuilt(out_dir) if prebuilt is not None else None
        if info is not None:
            return info, PREBUILT
    return build(out_dir), BUILT


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Held while `.cache/`'s build of `name` is checked or made: processes side by side (test workers,
    benchmarks) wait for the first one's build instead of building it again over each other."""
    from outcome_flywheel.settings import PROJECT_ROOT

    (PROJECT_ROOT / ".cache").mkdir(exist_ok=True)
    with open(PROJECT_ROOT / ".cache" / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def cache_dir(name: str, fingerprint: str) -> Path:
    """`.cache/<name>-<fingerprint>` in the project: a model built once per machine (tests and
    benchmarks link it into their data dirs)."""
    from outcome_flywheel.settings import PROJECT_ROOT

    return PROJECT_ROOT / ".cache" / f"{name}-{fingerprint}"
