"""The build tail tiny-local and SmolLM2 share (outcome_flywheel/models/provision/folder.py): a folder is
published whole with its build info, or not at all; a folder with the asked fingerprint is kept."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from outcome_flywheel.models.provision.folder import (
    cache_lock,
    ensure_folder,
    read_build_info,
    save_model_folder,
    weights_sha256,
)


class _Model:
    """Writes one safetensors file, as `save_pretrained` does; two tensors of 6 and 4 parameters."""

    def __init__(self, scale: float = 1.0):
        self.tensors = {"a": np.arange(6, dtype=np.float32) * scale, "b": np.ones(4, dtype=np.float32)}

    def save_pretrained(self, folder):
        from safetensors.numpy import save_file

        save_file(self.tensors, str(folder / "model.safetensors"))
        (folder / "config.json").write_text("{}")

    def parameters(self):
        return [_Tensor(t) for t in self.tensors.values()]


class _Tensor:
    def __init__(self, array):
        self.array = array

    def numel(self) -> int:
        return self.array.size


class _Tokenizer(list):
    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text(json.dumps(list(self)))


def test_the_tail_publishes_the_folder_with_its_build_info(tmp_path):
    finished = []
    info = save_model_folder(
        tmp_path / "m", _Model(), _Tokenizer("abc"), {"name": "m", "fingerprint": "f1"}, 0.0, finish=finished.append
    )
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no staging folder left
    assert finished and finished[0].parent == tmp_path and finished[0].name.startswith(".m.")
    assert info == read_build_info(tmp_path / "m")
    assert (info["name"], info["fingerprint"], info["parameters"], info["vocab_size"]) == ("m", "f1", 10, 3)
    assert info["weights_sha256"] == weights_sha256(tmp_path / "m")
    other = save_model_folder(tmp_path / "n", _Model(scale=2.0), _Tokenizer("abc"), {}, 0.0)
    assert other["weights_sha256"] != info["weights_sha256"]


def test_a_failing_tail_leaves_the_old_folder_and_nothing_else(tmp_path):
    save_model_folder(tmp_path / "m", _Model(), _Tokenizer("abc"), {"fingerprint": "old"}, 0.0)

    def fail(_folder):
        raise RuntimeError("config fix-up failed")

    with pytest.raises(RuntimeError, match="fix-up"):
        save_model_folder(tmp_path / "m", _Model(scale=3.0), _Tokenizer("xyz"), {"fingerprint": "new"}, 0.0, fail)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
    assert read_build_info(tmp_path / "m")["fingerprint"] == "old"


def test_ensure_keeps_a_matching_folder_then_tries_the_prebuilt_then_builds(tmp_path):
    calls = []

    def build(folder):
        calls.append("build")
        return save_model_folder(folder, _Model(), _Tokenizer("ab"), {"fingerprint": "f1"}, 0.0)

    def prebuilt(folder):
        calls.append("prebuilt")
        return None

    info, source = ensure_folder(tmp_path / "m", "f1", build, prebuilt=prebuilt)
    assert source == "built" and calls == ["prebuilt", "build"]
    assert ensure_folder(tmp_path / "m", "f1", build, prebuilt=prebuilt) == (info, "existing")
    assert calls == ["prebuilt", "build"]  # kept: neither called
    assert ensure_folder(tmp_path / "m", "f1", build, rebuild=True, prebuilt=prebuilt)[1] == "built"
    assert calls == ["prebuilt", "build", "build"]  # rebuild skips the prebuilt one
    _, source = ensure_folder(
        tmp_path / "m", "f2", build, prebuilt=lambda folder: calls.append("prebuilt") or {"fingerprint": "f2"}
    )
    assert calls[-1] == "prebuilt" and source == "prebuilt"  # another fingerprint: the prebuilt one stands in


def test_a_cache_build_waits_for_the_one_under_way():
    """Test workers and benchmarks side by side: a second process asking for `.cache/`'s build waits while the
    first holds `cache_lock`, and goes on once it is released (it then finds the build, `ensure_folder`)."""
    child_code = (
        "import time\nfrom outcome_flywheel.models.provision.folder import cache_lock\n"
        "print('asking', flush=True)\nwith cache_lock('lock-test'):\n    print('holding', flush=True)\n"
    )
    with cache_lock("lock-test"):
        child = subprocess.Popen([sys.executable, "-c", child_code], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "asking"
        time.sleep(1.0)
        assert child.poll() is None  # still waiting for the lock
    assert child.stdout.readline().strip() == "holding"
    assert child.wait(timeout=60) == 0
