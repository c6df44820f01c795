"""`flywheel export`: a policy checkpoint or a preference adapter as a standalone Hugging Face folder
that transformers loads alone (no adapter, no project code) and whose logits equal the served model's;
GGUF when llama.cpp's converter is installed, a clear message when it is not; bad input refused."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from outcome_flywheel.cli import main
from outcome_flywheel.daily_rl.policy.checkpoints import publish_checkpoint
from outcome_flywheel.models.serve.export import EXPORT_FILE, find_converter
from outcome_flywheel.models.serve.serving import ModelServer
from tests.service_fixtures import publish_adapter
from tests.serving_fixtures import PolicyPublisher, loader, tiny_root

MESSAGES = [{"role": "user", "content": "Write a trading note on: chips rally"}]
# transformers alone, in a fresh interpreter: the folder's logits for the chat-rendered prompt.
STANDALONE = """
import json, sys, numpy as np, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, messages, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
tok = AutoTokenizer.from_pretrained(folder)
ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
with torch.no_grad():
    logits = model(torch.tensor([list(ids)])).logits[0]
np.save(out, logits.numpy()); print(json.dumps(list(ids)))
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    root = tiny_root(tmp_path_factory.mktemp("export"), tiny_model_dir)
    publisher = PolicyPublisher(root)
    publish_checkpoint(
        publisher.backend,
        publisher.ckpt_root,
        "2025-11-02",
        {"date": "2025-11-02", "base_model": "tiny-local"},
        is_base=True,
    )
    publisher.publish("2025-11-03", seed=1)
    publish_adapter(root, "run-1", seed=5)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            "FLYWHEEL_DATA_DIR": str(root),
            "FLYWHEEL_BASE_MODEL": "tiny-local",
            "FLYWHEEL_DEVICE": "cpu",
            "FLYWHEEL_BACKEND": "torch",
            "OMP_NUM_THREADS": "1",
        }.items():
            mp.setenv(name, value)
        mp.delenv("FLYWHEEL_LLAMA_CPP_DIR", raising=False)
        yield {"root": root, "server": ModelServer(loader(root), root), "publisher": publisher}


def standalone_logits(folder, tmp_path) -> tuple[list[int], np.ndarray]:
    done = subprocess.run(
        [sys.executable, "-c", STANDALONE, str(folder), json.dumps(MESSAGES), str(tmp_path / "logits.npy")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), np.load(tmp_path / "logits.npy")


def served_logits(backend, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return backend.model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("source", ["policy", "preference"])
def test_the_export_loads_alone_and_its_logits_equal_the_served_models(world, source, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", source, str(out)]) == 0
    said = capsys.readouterr().out
    served = world["server"].model(source)
    assert served.version in said and "LoRA merged" in said and "no GGUF" in said and "llama.cpp" in said
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", EXPORT_FILE} <= files
    assert not any(name.startswith("adapter_") for name in files)  # merged: no adapter left to load
    record = json.loads((out / EXPORT_FILE).read_text())
    assert record["version"] == served.version and record["merged_lora"] is True
    base_config = json.loads((served.backend.model_path / "config.json").read_text())
    kept = set(json.loads((out / "config.json").read_text()))
    assert (
        set(base_config) - {"dtype", "torch_dtype", "transformers_version", "_name_or_path"} <= kept
    )  # nothing dropped

    ids, logits = standalone_logits(out, tmp_path)
    assert ids == served.backend.prompt_ids(MESSAGES)  # the same chat template, rendered by transformers alone
    expected = served_logits(served.backend, ids)
    assert np.abs(logits - expected).max() < 1e-4
    base = served_logits(loader(world["root"]).load(), ids)
    assert np.abs(logits - base).max() > 1e-3  # the LoRA is in the weights: not the base model's logits


def test_a_base_checkpoint_folder_exports_the_base_model(world, tmp_path, capsys):
    out = tmp_path / "base"
    assert main(["export", str(world["publisher"].ckpt_root / "2025-11-02"), str(out)]) == 0
    assert "2025-11-02@base (base)" in capsys.readouterr().out
    ids, logits = standalone_logits(out, tmp_path)
    assert np.abs(logits - served_logits(loader(world["root"]).load(), ids)).max() < 1e-5


def test_a_full_fine_tune_checkpoint_exports_its_own_weights(world, tmp_path, capsys):
    full = loader(world["root"]).load()
    with torch.no_grad():
        full.model.model.norm.weight.mul_(1.5)  # a full fine-tune's change: no adapter, other weights
    info = publish_checkpoint(
        full, tmp_path / "ckpts", "2025-11-09", {"date": "2025-11-09", "base_model": "tiny-local"}, is_base=False
    )
    assert info["kind"] == "full"
    out = tmp_path / "full"
    assert main(["export", str(tmp_path / "ckpts" / "2025-11-09"), str(out)]) == 0
    assert f"{info['policy_version']} (full)" in capsys.readouterr().out
    ids, logits = standalone_logits(out, tmp_path)
    assert np.abs(logits - served_logits(full, ids)).max() < 1e-5
    assert np.abs(logits - served_logits(loader(world["root"]).load(), ids)).max() > 1e-3


def test_exporting_again_replaces_the_export_never_another_folder(world, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", "preference", str(out)]) == 0
    first = (out / "model.safetensors").read_bytes()
    (out / "stale.txt").write_text("from an older export")
    assert main(["export", "preference", str(out)]) == 0
    assert (out / "model.safetensors").read_bytes() == first and not (out / "stale.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    capsys.readouterr()
    assert main(["export", "preference", str(mine)]) == 1
    assert "is not an earlier export" in capsys.readouterr().err and (mine / "notes.txt").read_text() == "keep"


def test_bad_sources_and_a_missing_converter_are_clear(world, tmp_path, capsys, monkeypatch):
    assert main(["export", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 1
    assert "no such folder" in capsys.readouterr().err
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 1
    assert "holds no checkpoint.json, adapter_config.json or model" in capsys.readouterr().err
    assert main(["export", "policy", str(tmp_path / "out"), "--gguf", "always"]) == 1
    err = capsys.readouterr().err
    assert (
        "convert_hf_to_gguf.py is not installed" in err
        and "FLYWHEEL_LLAMA_CPP_DIR" in err
        and not (tmp_path / "out").exists()
    )
    monkeypatch.setenv("FLYWHEEL_LLAMA_CPP_DIR", str(tmp_path))
    assert main(["export", "policy", str(tmp_path / "out"), "--gguf", "always"]) == 1
    assert f"FLYWHEEL_LLAMA_CPP_DIR={tmp_path} holds no convert_hf_to_gguf.py" in capsys.readouterr().err
    assert main(["export", "policy"]) == 2  # OUT missing: a usage error


def test_nothing_published_yet(tmp_path, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tiny_root(tmp_path, tiny_model_dir)))
    monkeypatch.setenv("FLYWHEEL_BASE_MODEL", "tiny-local")
    assert main(["export", "policy", str(tmp_path / "out")]) == 1
    assert "no verified, accepted policy checkpoint" in capsys.readouterr().err


CONVERTER = find_converter()  # before the fixtures clear FLYWHEEL_LLAMA_CPP_DIR


@pytest.mark.skipif(
    CONVERTER is None,
    reason="llama.cpp's convert_hf_to_gguf.py is not installed (FLYWHEEL_LLAMA_CPP_DIR "
    "or PATH): GGUF is an optional extra, docs/serving.md",
)
def test_gguf_logits_equal_the_served_models(tmp_path, monkeypatch, capsys):
    """On smollm2-135m-instruct (llama.cpp knows its tokenizer; tiny-local's it refuses, clearly):
    transformers' GGUF loader reads the file back and its logits are the served model's."""
    import gguf
    from transformers import AutoModelForCausalLM

    from outcome_flywheel.models.provision.smollm2 import cached_smollm2

    root = tmp_path / "data"
    (root / "models").mkdir(parents=True)
    (root / "models" / "smollm2-135m-instruct").symlink_to(cached_smollm2(log=lambda *a: None))
    for name, value in {
        "FLYWHEEL_DATA_DIR": str(root),
        "FLYWHEEL_BASE_MODEL": "smollm2-135m-instruct",
        "FLYWHEEL_DEVICE": "cpu",
        "FLYWHEEL_LLAMA_CPP_DIR": str(CONVERTER.parent),
    }.items():
        monkeypatch.setenv(name, value)
    PolicyPublisher(root, "smollm2-135m-instruct").publish("2025-11-03", seed=1)
    out = tmp_path / "export"
    assert main(["export", "policy", str(out), "--gguf", "always", "--gguf-type", "f32"]) == 0
    assert "GGUF" in capsys.readouterr().out and json.loads((out / EXPORT_FILE).read_text())["gguf"] == "model.gguf"
    reader = gguf.GGUFReader(out / "model.gguf")
    assert reader.get_field("general.architecture").contents() == "llama"
    assert float(reader.get_field("llama.rope.freq_base").contents()) == 100000.0  # smollm2's, not llama.cpp's default
    del reader
    model = AutoModelForCausalLM.from_pretrained(out, gguf_file="model.gguf", dtype=torch.float32).eval()
    served = ModelServer(loader(root, "smollm2-135m-instruct"), root).model("policy").backend
    ids = served.prompt_ids(MESSAGES)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(logits - served_logits(served, ids)).max() < 1e-3
