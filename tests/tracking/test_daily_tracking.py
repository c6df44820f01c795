"""The daily loop on the record: real days of tiny-local recorded in a real MLflow SQLite store (the embedded
default under the data dir), the registry's aliases following `latest` through an accepted and a rejected
day, and a dead tracking server that fails no day."""

import json
import os
import socket

import dagster as dg
import pytest
from mlflow import MlflowClient

from assets.daily_rl.daily_report import daily_report
from assets.daily_rl.daily_update import daily_update
from assets.daily_rl.headlines import headlines
from outcome_flywheel.daily_rl.day_record import mirror_policy
from outcome_flywheel.tracking import Tracker
from outcome_flywheel.tracking.registry import POLICY_MODEL
from tests.daily_fixtures import daily_resources, linked_data_dir

DAYS = ["2025-11-03", "2025-11-04", "2025-11-05"]
SIZES = {"rollouts_per_headline": 2, "max_new_tokens": 24, "batch_size": 4}
# day 3's update is rejected: any KL to the parent is over this budget
REJECT = {"gate_max_kl_to_parent": 1e-12}


def _config(day: str) -> dict:
    return {"ops": {"daily_update": {"config": {**SIZES, **(REJECT if day == DAYS[2] else {})}}}}


def _checkpoint_metadata(result) -> dict:
    return {
        k: getattr(v, "value", v)
        for e in result.get_asset_materialization_events()
        if e.asset_key.to_user_string() == "policy_checkpoint"
        for k, v in e.materialization.metadata.items()
    }


@pytest.fixture(scope="module")
def days(tmp_path_factory, tiny_model_dir):
    """Three days into one data dir, recorded in its embedded store: base, accepted, rejected."""
    root = linked_data_dir(tmp_path_factory.mktemp("tracked"), tiny_model_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_DATA_DIR", str(root))
        res = daily_resources(root, max_headlines=2, tracking_uri="")
        results = {
            day: dg.materialize([headlines, daily_update], partition_key=day, resources=res, run_config=_config(day))
            for day in DAYS
        }
        results["report"] = dg.materialize([daily_report], partition_key=DAYS[2], resources=res)
        yield root, res, results


def _client(root) -> MlflowClient:
    uri = f"sqlite:///{root / 'mlflow' / 'mlflow.db'}"
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def test_each_day_is_a_run_with_params_per_step_metrics_tags_and_artifacts(days):
    root, _, results = days
    assert all(r.success for r in results.values())
    client = _client(root)
    experiment = client.get_experiment_by_name("outcome-flywheel/daily_rl")
    found = client.search_runs([experiment.experiment_id])
    runs = {r.data.tags["partition"]: r for r in found if r.data.tags["asset_key"] == "policy_checkpoint"}
    assert set(runs) == set(DAYS)
    trained = runs[DAYS[1]]
    meta = _checkpoint_metadata(results[DAYS[1]])
    # links both ways: the asset's metadata names the run, the run the Dagster run and asset
    assert meta["mlflow_record"] == "recorded" and meta["mlflow_run_id"] == trained.info.run_id
    assert meta["mlflow_run_url"].endswith(f"#/experiments/{experiment.experiment_id}/runs/{trained.info.run_id}")
    assert trained.data.tags["dagster_run_id"] == results[DAYS[1]].run_id
    assert trained.data.tags["asset_key"] == "policy_checkpoint"
    info = json.loads((root / "checkpoints" / "policy" / DAYS[1] / "checkpoint.json").read_text())
    assert trained.data.tags["policy_version"] == info["policy_version"]
    assert trained.data.tags["parent"] == info["parent_version"]
    # params: the day's settings and the trainer's config
    params = trained.data.params
    assert params["settings.rollouts_per_headline"] == "2" and params["gspo.learning_rate"]
    assert params["models.base_model"] == "tiny-local"
    # per optimiser step: loss, grad norm, clip fraction, KL
    steps = int(trained.data.metrics["day/steps"])
    assert steps >= 1
    for name in ("loss", "grad_norm", "clip_fraction"):
        history = client.get_metric_history(trained.info.run_id, name)
        assert [m.step for m in history] == list(range(1, steps + 1)), name
    assert "day/gate_kl_to_parent" in trained.data.metrics and "reward/structure" in trained.data.metrics
    artifacts = [a.path for a in client.list_artifacts(trained.info.run_id, "checkpoint")]
    assert artifacts == ["checkpoint/checkpoint.json"]
    assert (root / "mlflow" / "artifacts").is_dir()
    # the first day trained nothing: a run without steps
    assert not client.get_metric_history(runs[DAYS[0]].info.run_id, "loss")


def test_the_report_is_a_run_with_the_charts_the_status_page_draws(days):
    root, _, results = days
    client = _client(root)
    experiment = client.get_experiment_by_name("outcome-flywheel/daily_rl")
    (report,) = client.search_runs([experiment.experiment_id], "tags.asset_key = 'daily_report'")
    assert report.data.tags["partition"] == DAYS[2] and report.data.tags["dagster_run_id"] == results["report"].run_id
    charts = {a.path for a in client.list_artifacts(report.info.run_id, "charts")}
    assert {"charts/reward.png", "charts/kl.png", "charts/ab.png"} <= charts
    assert "day/headlines" in report.data.metrics


def test_the_aliases_follow_latest_through_an_accepted_and_a_rejected_day(days):
    root, _, results = days
    client = _client(root)
    ckpt = root / "checkpoints" / "policy"
    info = {d: json.loads((ckpt / d / "checkpoint.json").read_text()) for d in DAYS}
    assert info[DAYS[1]]["gate"] == "accepted" and info[DAYS[2]]["gate"] == "rejected"
    assert os.readlink(ckpt / "latest") == DAYS[2]
    champion = client.get_model_version_by_alias(POLICY_MODEL, "champion")
    challenger = client.get_model_version_by_alias(POLICY_MODEL, "challenger")
    # champion: exactly what `latest` points to (day 3 republishes day 2's weights)
    assert champion.tags["checkpoint"] == DAYS[2] and champion.source == (ckpt / DAYS[2]).resolve().as_uri()
    assert champion.tags["policy_version"] == info[DAYS[1]]["policy_version"]
    # challenger: the rejected candidate, kept with its verdict and reason
    assert challenger.tags["checkpoint"] == f"{DAYS[2]}/candidate"
    assert challenger.tags["verdict"] == "rejected" and challenger.tags["reason"] == info[DAYS[2]]["gate_reason"]
    # the accepted day kept its version, by reference to its folder
    accepted = client.search_model_versions(f"name='{POLICY_MODEL}' and tags.checkpoint='{DAYS[1]}'")
    assert len(accepted) == 1 and accepted[0].tags["verdict"] == "accepted"
    assert accepted[0].source == (ckpt / DAYS[1]).resolve().as_uri()
    meta = _checkpoint_metadata(results[DAYS[2]])
    assert meta["mlflow_champion_version"] == str(champion.version)
    assert meta["mlflow_challenger_version"] == str(challenger.version)


def _write_checkpoint(root, name: str, **info) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "checkpoint.json").write_text(json.dumps({"verified": True, "date": name[:10], **info}))


def test_aliases_move_with_latest_without_training(tmp_path):
    """The mirror alone (no model): accepted day -> champion and challenger on it; rejected day -> champion on
    the republished parent, challenger on the rejected candidate; a later accepted day takes both back."""
    root = tmp_path / "checkpoints" / "policy"
    tracker = Tracker(data_dir=str(tmp_path))
    client = MlflowClient(tracking_uri=tracker.store_uri(), registry_uri=tracker.store_uri())

    def day(name, gate, version, reason=""):
        _write_checkpoint(root, name, policy_version=version, kind="lora", gate=gate, gate_reason=reason)
        (root / "latest").unlink(missing_ok=True)
        (root / "latest").symlink_to(name)
        with tracker.start("daily_rl", name) as run:
            return mirror_policy(run, root, name, gate, reason)

    def alias(name):
        return client.get_model_version_by_alias(POLICY_MODEL, name).tags

    day("2025-11-04", "accepted", "2025-11-04@aaa")
    assert alias("champion")["checkpoint"] == alias("challenger")["checkpoint"] == "2025-11-04"
    out = day("2025-11-05", "rejected", "2025-11-04@aaa", "kl_to_parent 0.3 > 0.25")
    assert alias("champion")["checkpoint"] == "2025-11-05" and alias("champion")["policy_version"] == "2025-11-04@aaa"
    assert alias("challenger")["verdict"] == "rejected" and alias("challenger")["reason"] == "kl_to_parent 0.3 > 0.25"
    assert out["mlflow_challenger_version"] != out["mlflow_champion_version"]
    day("2025-11-06", "accepted", "2025-11-06@bbb")
    assert alias("champion")["checkpoint"] == alias("challenger")["checkpoint"] == "2025-11-06"
    # a re-run of a day registers nothing new
    before = len(client.search_model_versions(f"name='{POLICY_MODEL}'"))
    day_again = root / "2025-11-06"
    with tracker.start("daily_rl", "again") as run:
        mirror_policy(run, root, day_again.name, "accepted", "")
    assert len(client.search_model_versions(f"name='{POLICY_MODEL}'")) == before == 4


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_tracking_server_fails_no_day(tmp_path, tiny_model_dir, monkeypatch):
    root = linked_data_dir(tmp_path, tiny_model_dir)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(root))
    res = daily_resources(root, max_headlines=2, tracking_uri=f"http://127.0.0.1:{_closed_port()}")
    result = dg.materialize(
        [headlines, daily_update], partition_key=DAYS[0], resources=res, run_config=_config(DAYS[0])
    )
    assert result.success
    meta = _checkpoint_metadata(result)
    assert meta["mlflow_record"].startswith("failed: start the run:"), meta
    assert "mlflow_run_url" not in meta and float(meta["mlflow_seconds"]) < 30
    assert os.readlink(root / "checkpoints" / "policy" / "latest") == DAYS[0]
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the limits held for the tracker's calls only


def test_a_day_whose_training_raises_is_a_failed_run_with_its_error(tmp_path, tiny_model_dir, monkeypatch):
    """The day's training raises on its way (here: GSPO's trainer): the day fails with that error, `latest` stays
    on the day before, and the MLflow store holds a FAILED run of that day with the error as tags."""
    import outcome_flywheel.daily_rl.policy.update as update

    root = linked_data_dir(tmp_path, tiny_model_dir)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(root))
    res = daily_resources(root, max_headlines=2, tracking_uri="")
    for day in DAYS[:2]:
        dg.materialize([headlines], partition_key=day, resources=res)
    assert dg.materialize([daily_update], partition_key=DAYS[0], resources=res, run_config=_config(DAYS[0])).success

    def broken(policy, examples, config):
        raise RuntimeError("the trainer broke mid-way")

    monkeypatch.setattr(update, "train_gspo", broken)
    failed = dg.materialize(
        [daily_update], partition_key=DAYS[1], resources=res, run_config=_config(DAYS[1]), raise_on_error=False
    )
    assert not failed.success
    assert os.readlink(root / "checkpoints" / "policy" / "latest") == DAYS[0]
    assert not list((root / "checkpoints" / "policy").glob(".*.staging"))  # nothing staged is left behind
    client = _client(root)
    experiment = client.get_experiment_by_name("outcome-flywheel/daily_rl")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert runs[f"daily_update {DAYS[0]}"].info.status == "FINISHED"
    run = runs[f"daily_update {DAYS[1]}"]
    assert run.info.status == "FAILED"
    assert run.data.tags["error_type"] == "RuntimeError" and "the trainer broke mid-way" in run.data.tags["error"]
    assert run.data.tags["partition"] == DAYS[1] and run.data.tags["dagster_run_id"] == failed.run_id
