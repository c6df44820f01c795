"""The preference loop on the record: a real weighted-DPO training of tiny-local, its holdout AUC and drift,
recorded in the data dir's MLflow SQLite store, the adapter registered by reference as `preference-adapter`."""

import dagster as dg
from mlflow import MlflowClient

from assets.preferences.adapter import preference_adapter
from assets.preferences.evaluation import holdout_eval, style_drift
from outcome_flywheel.tracking import Tracker
from outcome_flywheel.tracking.registry import ADAPTER_MODEL
from resources.steps import StepRunnerResource
from tests.pipelines.test_pipes_steps import preference_pool


def test_the_adapter_and_its_evaluation_are_runs_and_the_adapter_a_model_version(
    tmp_path, warehouse, model_backend, data_dir
):
    res = preference_pool(tmp_path, warehouse, model_backend, data_dir, StepRunnerResource(runner="in_process"))
    res["tracking"] = Tracker(data_dir=str(data_dir))
    cfg = {"ops": {"preference_adapter": {"config": {"epochs": 1, "batch_size": 16}}}}
    result = dg.materialize([preference_adapter, holdout_eval, style_drift], resources=res, run_config=cfg)
    assert result.success
    meta = {
        e.asset_key.to_user_string(): {k: getattr(v, "value", v) for k, v in e.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
    }
    uri = Tracker(data_dir=str(data_dir)).store_uri()
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.get_experiment_by_name("outcome-flywheel/preferences")
    runs = {r.data.tags["asset_key"]: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"preference_adapter", "holdout_eval", "style_drift"}
    trained = runs["preference_adapter"]
    assert meta["preference_adapter"]["mlflow_run_id"] == trained.info.run_id
    assert meta["preference_adapter"]["mlflow_run_url"].endswith(f"/runs/{trained.info.run_id}")
    assert trained.data.tags["dagster_run_id"] == result.run_id
    assert trained.data.params["dpo.beta"] and trained.data.params["models.base_model"] == "tiny-local"
    steps = int(trained.data.metrics["steps"])
    assert [m.step for m in client.get_metric_history(trained.info.run_id, "loss")] == list(range(1, steps + 1))
    assert "auc" in runs["holdout_eval"].data.metrics and meta["holdout_eval"]["mlflow_record"] == "recorded"
    assert runs["style_drift"].data.tags["drift"] == meta["style_drift"]["drift"]
    champion = client.get_model_version_by_alias(ADAPTER_MODEL, "champion")
    adapters = warehouse.path("adapters", "preference")
    assert champion.source == adapters.joinpath("latest").resolve().as_uri()
    assert champion.run_id == trained.info.run_id


def test_an_adapter_training_that_raises_is_a_failed_run_and_publishes_nothing(
    tmp_path, warehouse, model_backend, data_dir, monkeypatch
):
    import outcome_flywheel.preferences.adapter_step as adapter_step

    res = preference_pool(tmp_path, warehouse, model_backend, data_dir, StepRunnerResource(runner="in_process"))
    res["tracking"] = Tracker(data_dir=str(data_dir))

    def broken(backend, pairs, cfg):
        raise RuntimeError("DPO broke mid-way")

    monkeypatch.setattr(adapter_step, "train_weighted_dpo", broken)
    cfg = {"ops": {"preference_adapter": {"config": {"epochs": 1, "batch_size": 16}}}}
    result = dg.materialize([preference_adapter], resources=res, run_config=cfg, raise_on_error=False)
    assert not result.success
    assert not warehouse.path("adapters", "preference", "latest").exists()
    uri = Tracker(data_dir=str(data_dir)).store_uri()
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.get_experiment_by_name("outcome-flywheel/preferences")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["asset_key"] == "preference_adapter"
    assert run.data.tags["error_type"] == "RuntimeError" and "DPO broke mid-way" in run.data.tags["error"]
    assert run.data.tags["dagster_run_id"] == result.run_id and run.data.params["dpo.beta"]
