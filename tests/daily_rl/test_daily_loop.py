"""The daily loop's assets materialised in-process on tiny-local: three days in order, a re-run,
an override re-run, and the definitions (schedule, job, multi-asset shape)."""

import json
import os

import dagster as dg
import pytest

from assets.daily_rl.daily_update import KEYS, daily_update
from assets.daily_rl.headlines import headlines
from outcome_flywheel.daily_rl.judge.llm_judge import Judge
from outcome_flywheel.daily_rl.judge.ranking import is_permutation
from pipelines.daily_rl import DAILY_RL_ASSETS
from tests.daily_fixtures import daily_resources, linked_data_dir

DAYS = ["2025-11-03", "2025-11-04", "2025-11-05"]
SMALL = {"ops": {"daily_update": {"config": {"rollouts_per_headline": 4, "max_new_tokens": 40, "batch_size": 8}}}}


def _run(res, day, run_config=SMALL, assets=tuple(DAILY_RL_ASSETS), **kwargs):
    return dg.materialize(list(assets), partition_key=day, resources=res, run_config=run_config, **kwargs)


@pytest.fixture(scope="module")
def loop(tmp_path_factory, tiny_model_dir):
    """Three consecutive days of the loop, materialised in order into one data dir."""
    root = linked_data_dir(tmp_path_factory.mktemp("daily"), tiny_model_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_DATA_DIR", str(root))
        res = daily_resources(root)
        results = {day: _run(res, day) for day in DAYS}
        yield root, res, results


def _checks(result) -> dict:
    return {(e.asset_key.to_user_string(), e.check_name): e.passed for e in result.get_asset_check_evaluations()}


def test_three_days_in_order(loop):
    root, res, results = loop
    wh = res["warehouse"]
    assert all(r.success for r in results.values())
    for result in results.values():
        checks = _checks(result)
        assert len(checks) == 9 and all(checks.values()), checks
    ckpt = root / "checkpoints" / "policy"
    info = [json.loads((ckpt / d / "checkpoint.json").read_text()) for d in DAYS]
    assert all(i["verified"] for i in info)  # every day passed its blocking checks
    # day 1: nothing to score, nothing trained, the base policy
    assert wh.read("rollout_scores", DAYS[0]).empty
    assert info[0]["kind"] == "base" and not info[0]["trained"]
    # days 2 and 3: yesterday's 3 x 4 rollouts scored and trained on, chained checkpoints
    for i in (1, 2):
        scores = wh.read("rollout_scores", DAYS[i])
        assert len(scores) == 12 and scores["headline_id"].nunique() == 3
        assert set(scores["prediction_date"]) == {DAYS[i - 1]} and set(scores["outcome_headlines_date"]) == {DAYS[i]}
        assert all(is_permutation(list(g["rank"])) for _, g in scores.groupby("headline_id"))
        assert scores["reward"].between(0, 1).all()
        prev = wh.read("rollouts", DAYS[i - 1])
        assert set(scores["headline_id"]) == set(prev["headline_id"])
        assert info[i]["kind"] == "lora" and info[i]["parent_version"] == info[i - 1]["policy_version"]
        assert info[i]["trained"] == (info[i]["examples"] > 0)
        assert (ckpt / DAYS[i] / "adapter_model.safetensors").exists()
    assert os.readlink(ckpt / "latest") == DAYS[2]
    for day, meta in zip(DAYS, info):
        rollouts = wh.read("rollouts", day)
        assert len(rollouts) == 12 and set(rollouts["policy_version"]) == {meta["policy_version"]}
        assert all(
            len(ids) == len(lp) == n
            for ids, lp, n in zip(rollouts["response_ids"], rollouts["behavior_logprobs"], rollouts["n_tokens"])
        )
    training = wh.read_all("policy_training")
    assert list(training["date"]) == DAYS and training["kl_to_base"].iloc[0] == 0.0
    # the memory budget's plan: none on the CPU, so a part a step and the layers' activations kept
    assert (training["train_micro_batches"] == training["steps"]).all() and not training["train_recomputed"].any()
    # the first trained day adds a fresh adapter with the configured settings, the next trains the one it carries
    trained = training[training["trained"]]["lora_adapter"].tolist()
    assert trained[0].startswith("fresh LoRA: r 8, alpha 16") and "configured" not in "".join(trained)
    assert all(t.startswith("LoRA carried from the parent: r 8, alpha 16") for t in trained[1:])
    report = wh.read("daily_report", DAYS[2])
    assert int(report["headlines"].iloc[0]) == 3 and int(report["rollouts"].iloc[0]) == 12
    assert (root / "reports" / "daily_rl" / DAYS[2] / "reward.png").read_bytes()[:4] == b"\x89PNG"


def test_two_days_in_bf16_pass_the_checkpoint_check_against_a_float32_reload(tmp_path, tiny_model_dir, monkeypatch):
    """FLYWHEEL_DTYPE=bfloat16 (what `auto` gives on CUDA): the loop samples, trains and reloads in
    bf16, and `generated_by_own_checkpoint` measures the stored log-probs against the checkpoint
    reloaded in float32 (a fixed bf16 tolerance failed SmolLM2's first day on an H200)."""
    root = linked_data_dir(tmp_path, tiny_model_dir)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(root))
    res = daily_resources(root, dtype="bfloat16")
    for day in DAYS[:2]:
        result = _run(res, day, assets=(headlines, daily_update))
        assert result.success
        check = next(e for e in result.get_asset_check_evaluations() if e.check_name == "generated_by_own_checkpoint")
        meta = {k: v.value for k, v in check.metadata.items()}
        assert check.passed and meta["compute_dtype"] == "bfloat16" and meta["version_matches"], meta
        # a float32 reference was computed: bf16 teacher forcing is measurably off it
        assert meta["rounding_mean_abs_gap"] > 0 and meta["worst_gap_over_tolerance"] <= 1.0, meta
    info = json.loads((root / "checkpoints" / "policy" / DAYS[1] / "checkpoint.json").read_text())
    assert info["kind"] == "lora" and info["verified"]


def test_a_day_at_learning_rate_0_keeps_the_parent_and_measures_its_kl_on_a_spread_sample(
    tmp_path, tiny_model_dir, monkeypatch
):
    """A held-out day (learning rate 0) takes no step and no gate: checkpoint D holds the parent's weights (the
    same hash in its version), and its notes come from them. `kl_to_base_rollouts` measures the day's KL on that
    many notes spread over the headlines: the figure equals the exact KL recomputed on that sample (the same
    weights and batch, so only float rounding may differ)."""
    from outcome_flywheel.daily_rl.policy.checkpoints import load_policy
    from outcome_flywheel.daily_rl.policy.rollouts import kl_to_base, spread_sample

    root = linked_data_dir(tmp_path, tiny_model_dir)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(root))
    res = daily_resources(root)
    for day in DAYS[:2]:
        assert _run(res, day, assets=(headlines, daily_update)).success
    frozen = {**SMALL["ops"]["daily_update"]["config"], "learning_rate": 0.0, "kl_to_base_rollouts": 5}
    config = {"ops": {"daily_update": {"config": frozen}}}
    assert _run(res, DAYS[2], run_config=config, assets=(headlines, daily_update)).success
    ckpt = root / "checkpoints" / "policy"
    parent, day = (json.loads((ckpt / d / "checkpoint.json").read_text()) for d in DAYS[1:])
    assert parent["trained"] and not day["trained"] and day["verified"]
    assert day["policy_version"] == f"{DAYS[2]}@{parent['policy_version'].split('@')[1]}"  # the same weights
    wh = res["warehouse"]
    row = wh.read("policy_training", DAYS[2]).iloc[0]
    assert row["gate"] == "not_trained" and row["gate_reason"] == "learning rate 0: the policy is frozen"
    rollouts = wh.read("rollouts", DAYS[2])
    assert set(rollouts["policy_version"]) == {day["policy_version"]}
    sample = spread_sample(rollouts, 5)
    # every headline's first note, then the second notes of the first two headlines
    assert (
        sorted(zip(sample["rollout_index"], sample["headline_id"]))
        == sorted(zip(rollouts["rollout_index"], rollouts["headline_id"]))[:5]
        and sample["headline_id"].nunique() == 3
    )
    policy = load_policy(res["model_backend"], ckpt / DAYS[2], day)
    assert row["kl_to_base"] > 0 and row["kl_to_base"] == pytest.approx(kl_to_base(policy, sample), rel=1e-6)
    assert row["kl_to_base"] != pytest.approx(kl_to_base(policy, rollouts), rel=1e-6)


def test_kl_to_base_rollouts_below_one_is_refused():
    from assets.daily_rl.daily_update import DailyUpdateConfig

    with pytest.raises(ValueError, match="kl_to_base_rollouts must be at least 1"):
        DailyUpdateConfig(kl_to_base_rollouts=0).settings("tiny-local")
    assert DailyUpdateConfig(kl_to_base_rollouts=1).settings("tiny-local").kl_to_base_rollouts == 1


def test_rerun_of_a_partition_keeps_row_counts_and_scores(loop):
    root, res, _ = loop
    wh = res["warehouse"]
    tables = ("headlines", "headlines_quarantine", "rollout_scores", "rollouts", "policy_training", "daily_report")
    before = {t: wh.read(t, DAYS[1]) for t in tables}
    totals = {t: len(wh.read_all(t)) for t in tables}
    result = _run(res, DAYS[1])
    assert result.success
    for t in tables:
        assert len(wh.read(t, DAYS[1])) == len(before[t]), t
        assert len(wh.read_all(t)) == totals[t], t
    # the judge is seeded: the same ranks again
    cols = ["headline_id", "rollout_index", "rank", "structure_score", "reward"]
    assert before["rollout_scores"][cols].equals(wh.read("rollout_scores", DAYS[1])[cols])


def test_override_rerun_scores_against_another_day(loop):
    root, res, _ = loop
    wh = res["warehouse"]
    assert _run(res, "2025-11-06", assets=[headlines], run_config=None).success
    override = {
        "ops": {
            "daily_update": {
                # lora_r as well: day 3 trains the adapter it carries from day 2, whose rank stays 8;
                # relevance_baseline: the scoring step takes the run's own setting
                "config": {
                    **SMALL["ops"]["daily_update"]["config"],
                    "outcome_headlines_date": "2025-11-06",
                    "lora_r": 4,
                    "relevance_baseline": "day",
                }
            }
        }
    }
    instance = dg.DagsterInstance.ephemeral()
    result = _run(res, DAYS[2], run_config=override, instance=instance)
    assert result.success
    carried = wh.read("policy_training", DAYS[2])["lora_adapter"].iloc[0]
    assert carried.startswith("LoRA carried from the parent: r 8, alpha 16") and "the configured r 4" in carried
    assert f"daily_update {DAYS[2]}: {carried}" in [e.user_message for e in instance.all_logs(result.run_id)]
    scores = wh.read("rollout_scores", DAYS[2])
    assert set(scores["outcome_headlines_date"]) == {"2025-11-06"} and set(scores["prediction_date"]) == {DAYS[1]}
    assert set(scores["relevance_baseline"]) == {"day"} and set(
        wh.read("rollout_scores", DAYS[1])["relevance_baseline"]
    ) == {"group"}
    shown = {h for s in scores["outcome_headlines_shown"] for h in json.loads(s)}
    assert shown <= set(wh.read("headlines", "2025-11-06")["title"])
    meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert meta["rollout_scores"]["override"].value is True
    info = json.loads((root / "checkpoints" / "policy" / DAYS[2] / "checkpoint.json").read_text())
    assert info["outcome_headlines_date"] == "2025-11-06"
    # outcomes must come after the predictions, and must be materialised
    bad = {"ops": {"daily_update": {"config": {"outcome_headlines_date": DAYS[1]}}}}
    assert not _run(res, DAYS[2], run_config=bad, assets=[daily_update], raise_on_error=False).success
    missing = {"ops": {"daily_update": {"config": {"outcome_headlines_date": "2025-11-20"}}}}
    assert not _run(res, DAYS[2], run_config=missing, assets=[daily_update], raise_on_error=False).success


def test_a_day_without_outcome_headlines_is_not_a_judgement(loop):
    root, res, _ = loop
    wh = res["warehouse"]
    empty = wh.read("headlines", DAYS[2]).head(0)
    wh.write("headlines", empty, partition="2025-11-21")  # a materialised day with no headlines
    config = {
        "ops": {
            "daily_update": {
                "config": {**SMALL["ops"]["daily_update"]["config"], "outcome_headlines_date": "2025-11-21"}
            }
        }
    }
    result = _run(res, DAYS[2], run_config=config, assets=[daily_update])
    assert result.success
    scores = wh.read("rollout_scores", DAYS[2])
    assert len(scores) == 12 and not scores["usable"].any()
    assert set(scores["unusable_reason"]) == {"no outcome headlines"} and (scores["advantage"] == 0).all()
    assert (scores["judge_rounds_answered"] == 0).all()  # the judge was not asked
    info = json.loads((root / "checkpoints" / "policy" / DAYS[2] / "checkpoint.json").read_text())
    # none of D-1's notes trained; what trained is only DAYS[0]'s notes, whose price matured on DAYS[2]
    ledger = wh.read("reward_ledger", DAYS[2])
    judged, matured = ledger[ledger["step"] == "judged"], ledger[ledger["step"] == "matured"]
    assert (
        len(judged) == 12
        and (judged["status"] == "dropped").all()
        and set(judged["reason"]) == {"no outcome headlines"}
    )
    assert set(matured["note_date"]) == {DAYS[0]}
    assert info["examples"] == int((matured["advantage"].abs() > 1e-8).sum())
    assert info["trained"] == (info["examples"] > 0)


def test_rollouts_of_another_policy_are_refused_before_training(loop):
    """pi_old must be the checkpoint being trained: rollouts(D-1) stamped with another version
    fail day D before anything is scored or written, naming the day to re-run."""
    root, res, _ = loop
    wh = res["warehouse"]
    rollouts = wh.read("rollouts", DAYS[1])
    before = wh.read("rollout_scores", DAYS[2])
    try:
        wh.write("rollouts", rollouts.assign(policy_version="2025-11-04@0123456789ab"), partition=DAYS[1])
        result = _run(res, DAYS[2], assets=[daily_update], raise_on_error=False)
        assert not result.success
        failure = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"][0]
        message = failure.step_failure_data.error.message + str(failure.step_failure_data.user_failure_data)
        assert f"re-run {DAYS[1]}" in message and "2025-11-04@0123456789ab" in message
        assert wh.read("rollout_scores", DAYS[2]).equals(before)  # nothing written
    finally:
        wh.write("rollouts", rollouts, partition=DAYS[1])


def test_definitions_shape_and_schedule():
    from pipelines.daily_rl import daily_rl_job, daily_rl_schedule, defs

    spec_deps = {spec.key.to_user_string(): spec.deps for spec in daily_update.specs}
    assert list(spec_deps) == list(KEYS)
    for key, deps in spec_deps.items():
        by_key = {d.asset_key.to_user_string(): d for d in deps}
        assert set(by_key) == {"headlines", "base_model", key}
        mapping = by_key[key].partition_mapping
        # D-1 and every earlier day whose notes' prices can mature by D (6 days for the default horizon of 1)
        assert isinstance(mapping, dg.TimeWindowPartitionMapping) and (mapping.start_offset, mapping.end_offset) == (
            -6,
            -1,
        )
    assert daily_update.can_subset is False
    assert daily_rl_schedule.cron_schedule == "0 6 * * *"
    assert daily_rl_schedule.execution_timezone == "America/New_York"
    assert daily_rl_job.name == "daily_rl_job"
    assert set(defs.resources) >= {"feeds", "judge"}


def test_judge_is_the_frozen_base_never_the_policy(model_backend):
    from outcome_flywheel.daily_rl.judge.ranking import JudgeGroup

    judge = Judge()
    backend = judge.load(model_backend)
    assert not backend.has_adapter and judge.describe(model_backend).startswith("frozen base")
    group = JudgeGroup(
        "Apple beats quarterly estimates",
        ["AAPL shares rise 3% after the news"],
        ["Trade Recommendation: Buy AAPL.", "We are cautious.", "Stop Loss: 5% below entry."],
        seed=1,
    )
    [result] = judge.rank(backend, [group])
    assert is_permutation(result.ranks) and len(result.answers) >= 1
