"""Foundation: definitions, the warehouse, tiny-local, the torch backend."""

from __future__ import annotations

import os

import dagster as dg
import duckdb
import numpy as np
import pandas as pd
import pytest
import torch

from assets.base_model import base_model
from outcome_flywheel.models.interface import LoraSettings, SamplingConfig
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.models.prompts import NOTE_SECTIONS, trading_note_messages
from outcome_flywheel.models.provision.tiny_local import TinyLocalConfig, build_tiny_local, weights_sha256
from outcome_flywheel.models.torch.backend import TorchBackend
from outcome_flywheel.storage import Warehouse
from tests.tolerances import assert_logprobs_close, logprob_tolerances

PROMPTS = [
    trading_note_messages("Nvidia beats quarterly estimates on strong data center demand", "Revenue rose 12%."),
    trading_note_messages("Exxon Mobil cuts outlook, shares slide after hours"),
    trading_note_messages("Apple announces $40 billion share buyback", "The board approved it."),
]


def test_definitions_load():
    from pipelines.definitions import defs

    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert "base_model" in keys
    assert {"warehouse", "model_backend"} <= set(defs.resources)


# -- warehouse -----------------------------------------------------------------------------
def test_partition_write_is_idempotent_and_visible_in_duckdb(tmp_path):
    wh = Warehouse(data_dir=str(tmp_path))
    day1 = pd.DataFrame({"date": ["2025-11-03"] * 3, "x": [1, 2, 3]})
    day2 = pd.DataFrame({"date": ["2025-11-04"] * 2, "x": [4, 5]})
    wh.write("numbers", day1, partition="2025-11-03")
    wh.write("numbers", day2, partition="2025-11-04")
    wh.write("numbers", day1, partition="2025-11-03")  # re-run replaces, never appends
    assert len(wh.read_all("numbers")) == 5
    assert wh.partitions("numbers") == ["2025-11-03", "2025-11-04"]
    with duckdb.connect(str(wh.duckdb_path), read_only=True) as con:
        assert con.execute("SELECT count(*), sum(x) FROM numbers").fetchone() == (5, 15)
    assert wh.query("SELECT count(*) AS n FROM numbers WHERE date = '2025-11-04'")["n"][0] == 2
    # Replacing a partition with fewer rows shrinks it.
    wh.write("numbers", day1.head(1), partition="2025-11-03")
    assert len(wh.read_all("numbers")) == 3
    # find: the rows, or None for an absent partition (an empty partition is rows, not None)
    wh.write("numbers", day2.head(0), partition="2025-11-05")
    assert wh.find("numbers", "2025-11-06") is None and wh.read("numbers", "2025-11-06").empty
    assert wh.find("numbers", "2025-11-05").empty and list(wh.find("numbers", "2025-11-04")["x"]) == [4, 5]


def test_partition_write_is_atomic_when_the_write_fails(tmp_path, monkeypatch):
    wh = Warehouse(data_dir=str(tmp_path))
    good = pd.DataFrame({"x": [1, 2, 3]})
    target = wh.write("numbers", good, partition="2025-11-03")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        wh.write("numbers", pd.DataFrame({"x": [9]}), partition="2025-11-03")
    monkeypatch.undo()
    assert wh.read("numbers", "2025-11-03")["x"].tolist() == [1, 2, 3]
    assert [p.name for p in target.parent.iterdir()] == ["part.parquet"]  # no temp file left


def test_unpartitioned_tables_and_bad_names(tmp_path):
    wh = Warehouse(data_dir=str(tmp_path))
    wh.write("summary", pd.DataFrame({"a": [1]}))
    assert wh.read("summary")["a"].tolist() == [1]
    with pytest.raises(ValueError):
        wh.write("Bad-Name", pd.DataFrame({"a": [1]}))


# -- tiny-local ----------------------------------------------------------------------------
def test_tiny_local_build_is_reproducible(tmp_path):
    quick = TinyLocalConfig(train_steps=6, judge_examples=16, batch_size=4)
    a = build_tiny_local(tmp_path / "a", quick, log=lambda *_: None)
    b = build_tiny_local(tmp_path / "b", quick, log=lambda *_: None)
    c = build_tiny_local(
        tmp_path / "c", TinyLocalConfig(train_steps=6, judge_examples=16, batch_size=4, seed=1), log=lambda *_: None
    )
    assert a["weights_sha256"] == b["weights_sha256"] == weights_sha256(tmp_path / "a")
    assert c["weights_sha256"] != a["weights_sha256"]
    assert (tmp_path / "a" / "model.safetensors").exists() and (tmp_path / "a" / "tokenizer.json").exists()


def test_tiny_local_writes_note_like_text(torch_policy):
    groups = torch_policy.sample(PROMPTS, 8, SamplingConfig(max_new_tokens=96), seeds=[1, 2, 3])
    texts = [s.text for g in groups for s in g]
    with_headers = [t for t in texts if any(f"{name}:" in t for name in NOTE_SECTIONS)]
    full = [t for t in texts if all(f"{name}:" in t for name in NOTE_SECTIONS)]
    assert len(with_headers) >= len(texts) // 3  # note-like
    assert len(full) < len(texts)  # but not always all six sections: room to learn


# -- torch backend -------------------------------------------------------------------------
def test_batched_sampling_logprobs_match_teacher_forcing(torch_policy):
    n = 4
    cfg = SamplingConfig(max_new_tokens=48, temperature=0.8, top_p=0.95, top_k=50)
    groups = torch_policy.sample(PROMPTS, n, cfg, seeds=[11, 12, 13])
    assert [len(g) for g in groups] == [n] * len(PROMPTS)
    flat = [(PROMPTS[i], s) for i, g in enumerate(groups) for s in g]
    forced = torch_policy.response_logprobs(
        [p for p, _ in flat], [s.token_ids for _, s in flat], temperature=cfg.temperature
    )
    for (_, s), lp in zip(flat, forced):
        assert len(s.token_ids) == len(s.logprobs) == len(lp) > 0
        assert all(x <= 0 for x in s.logprobs)
    # the batched sampler's cached decode and teacher forcing, two fp32 computations: per token
    # within the rounding bound of tests/tolerances.py (was atol=1e-4)
    bounds = logprob_tolerances(
        torch_policy, [p for p, _ in flat], [s.token_ids for _, s in flat], temperature=cfg.temperature
    )
    assert_logprobs_close([np.array(s.logprobs) for _, s in flat], forced, bounds)
    # Samples within a group differ (sampling, not n copies of one sequence).
    assert len({tuple(s.token_ids) for s in groups[0]}) > 1


def test_sampling_is_reproducible_per_prompt_seed(torch_policy):
    cfg = SamplingConfig(max_new_tokens=32)
    alone = torch_policy.sample(PROMPTS[1:2], 3, cfg, seeds=[42])
    batched = torch_policy.sample(PROMPTS, 3, cfg, seeds=[7, 42, 9])
    assert [s.token_ids for s in alone[0]] == [s.token_ids for s in batched[1]]
    other = torch_policy.sample(PROMPTS[1:2], 3, cfg, seeds=[43])
    assert [s.token_ids for s in other[0]] != [s.token_ids for s in alone[0]]


def test_top_k_one_is_greedy(torch_policy):
    sampled = torch_policy.sample(PROMPTS[:1], 2, SamplingConfig(max_new_tokens=24, top_k=1), seeds=[5])
    greedy = torch_policy.greedy(PROMPTS[:1], max_new_tokens=24)
    assert sampled[0][0].text == sampled[0][1].text == greedy[0]


def test_lora_adapter_round_trip(torch_policy, tmp_path, model_backend):
    torch_policy.add_lora(LoraSettings(r=4, alpha=8))
    assert torch_policy.has_adapter
    assert 0 < torch_policy.num_parameters(trainable_only=True) < torch_policy.num_parameters()
    with torch.no_grad():  # LoRA B starts at zero: give it weight so the adapter changes outputs
        for name, p in torch_policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    response = torch_policy.encode_response("Trade Recommendation: Buy NVDA.")
    adapted = torch_policy.response_logprobs(PROMPTS[:1], [response])[0]
    base = torch_policy.response_logprobs(PROMPTS[:1], [response], use_adapter=False)[0]
    assert np.abs(adapted - base).max() > 1e-3
    torch_policy.save(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    reloaded = model_backend.load(adapter_path=tmp_path / "adapter")
    # A round trip, not two implementations: safetensors keeps the fp32 weights exactly and the
    # same kernels run on the same layout, so the bits match; 1e-5 is slack far below the
    # adapter's own effect (> 1e-3 above), so an adapter lost on the way fails.
    np.testing.assert_allclose(reloaded.response_logprobs(PROMPTS[:1], [response])[0], adapted, atol=1e-5)


def test_full_weights_round_trip(torch_policy, tmp_path):
    torch_policy.save(tmp_path / "full")
    assert list((tmp_path / "full").glob("*.safetensors")) and not list((tmp_path / "full").glob("*.bin"))
    reloaded = TorchBackend(tmp_path / "full", device="cpu")
    response = torch_policy.encode_response("Buy AAPL.")
    # a round trip of exact fp32 weights through the same kernels: the same bits; 1e-6 is slack
    np.testing.assert_allclose(
        reloaded.response_logprobs(PROMPTS[:1], [response])[0],
        torch_policy.response_logprobs(PROMPTS[:1], [response])[0],
        atol=1e-6,
    )


def test_device_resolution_and_backend_choice(model_backend):
    from outcome_flywheel.models.torch.backend import resolve_device

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type in {"cuda", "mps", "cpu"}
    with pytest.raises(ValueError):
        ModelLoader(data_dir=model_backend.data_dir, backend="jax").load()


def test_local_folder_base_model(tiny_model_dir, data_dir):
    resource = ModelLoader(data_dir=str(data_dir), base_model=str(tiny_model_dir))
    assert resource.base_model_dir() == tiny_model_dir


def test_base_model_asset_materializes(data_dir, model_backend, warehouse):
    result = dg.materialize([base_model], resources={"model_backend": model_backend, "warehouse": warehouse})
    assert result.success
    meta = result.asset_materializations_for_node("base_model")[0].metadata
    # the fixture's data dir links the cached build in: kept as it is, not copied from the bundle nor built
    assert meta["build_source"].value == "existing" and meta["reused_existing_build"].value is True
    assert meta["parameters"].value > 100_000 and meta["vocab_size"].value > 500
    checks = result.get_asset_check_evaluations()
    assert checks and all(c.passed for c in checks)


def test_base_model_in_a_fresh_data_dir_is_the_bundled_build(tmp_path, monkeypatch, tiny_model_dir):
    """A first `make demo`: no model folder yet, so the bundled tiny-local is verified and copied in; the
    metadata says so (not "reused", not "built"), and its weights are the cached build's."""
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "data"))
    models = ModelLoader(data_dir=str(tmp_path / "data"), base_model="tiny-local", backend="torch", device="cpu")
    result = dg.materialize(
        [base_model], resources={"model_backend": models, "warehouse": Warehouse(data_dir=str(tmp_path / "data"))}
    )
    meta = result.asset_materializations_for_node("base_model")[0].metadata
    assert meta["build_source"].value == "prebuilt" and meta["reused_existing_build"].value is False
    assert weights_sha256(models.local_model_dir()) == weights_sha256(tiny_model_dir)


def test_a_locked_duckdb_file_does_not_fail_the_parquet_write(tmp_path):
    import subprocess
    import sys
    import time as _time

    wh = Warehouse(data_dir=str(tmp_path), lock_wait_s=0.5)
    wh.write("numbers", pd.DataFrame({"x": [1]}), partition="2025-11-03")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, time; c = duckdb.connect({str(wh.duckdb_path)!r}); print('held', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        started = _time.monotonic()
        with pytest.raises(duckdb.IOException):
            with wh.connect():
                pass
        assert _time.monotonic() - started < 5
        fresh = Warehouse(data_dir=str(tmp_path), lock_wait_s=0.5)
        fresh.write(
            "other", pd.DataFrame({"y": [2, 3]}), partition="2025-11-03"
        )  # new table: view update is locked out
        assert fresh.read("other", "2025-11-03")["y"].tolist() == [2, 3]
    finally:
        holder.kill()
        holder.wait()
    fresh.write("other", pd.DataFrame({"y": [4]}), partition="2025-11-04")  # the next write makes the view
    with duckdb.connect(str(wh.duckdb_path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM other").fetchone() == (3,)
