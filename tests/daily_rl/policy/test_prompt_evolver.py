"""The prompt evolver (tier 1b): mutations that keep the prompt's logic, the UCB1 bandit's bookkeeping,
and two days of `daily_update` on tiny-local where a variant is written, tested on the held-out set and
sampled, with the prompt it was sampled under used by GSPO and the state reproduced by a re-run."""

import json

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from assets.daily_rl.baseline import baseline_rollouts
from assets.daily_rl.daily_update import daily_update
from assets.daily_rl.headlines import headlines
from outcome_flywheel.daily_rl.policy.prompt_evolver import EvolverConfig, PromptEvolver, interval
from outcome_flywheel.daily_rl.policy.prompt_tables import variant_table
from outcome_flywheel.daily_rl.policy.prompt_variants import (
    BASE_SPEC,
    IMPLIED_RULES,
    MUTATIONS,
    PromptSpec,
    acceptable_rewrite,
    mutate,
)
from outcome_flywheel.daily_rl.report.summary import prompt_evolver_summary
from outcome_flywheel.daily_rl.reward.examples import training_examples
from outcome_flywheel.models.prompts import NOTE_SECTIONS, SYSTEM_PROMPT, trading_note_messages
from tests.daily_fixtures import daily_resources, linked_data_dir
from tests.models.provision.test_smollm2 import offline, smollm2_dir  # noqa: F401 (fixtures: the converted SmolLM2 folder, offline)

DAYS = ["2025-11-03", "2025-11-04"]
# 3 headlines a day: a candidate after 3 scored trials (day 2), the held-out set = those 3 headlines
EVOLVE = {
    "ops": {
        "daily_update": {
            "config": {
                "rollouts_per_headline": 2,
                "max_new_tokens": 32,
                "batch_size": 8,
                "prompt_evolver_trials_per_variant": 3,
                "prompt_evolver_heldout_samples": 2,
            }
        }
    }
}


# -- mutations ---------------------------------------------------------------------------------
def _chain(seed: int, steps: int = 12) -> list[tuple[PromptSpec, str]]:
    rng, spec, out = np.random.default_rng(seed), BASE_SPEC, []
    for _ in range(steps):
        made = mutate(spec, rng)
        if made is None:
            break
        spec = made[0]
        out.append((spec, made[1]))
    return out


def test_base_variant_is_the_system_prompt_and_mutations_keep_the_logic():
    assert BASE_SPEC.render() == SYSTEM_PROMPT
    assert trading_note_messages("A", "b")[0]["content"] == SYSTEM_PROMPT
    seen = set()
    for seed in range(6):
        for spec, name in _chain(seed):
            seen.add(name)
            text = spec.render()
            assert "trading notes" in text  # the role survives
            if spec.rules:  # every rule the base implies is still there, in some wording
                assert len(spec.rules) == len(IMPLIED_RULES)
                assert all(s in text for s in NOTE_SECTIONS)
                assert any("no trade" in r for r in spec.rules) and any("long or short" in r for r in spec.rules)
            assert PromptSpec.from_json(spec.to_json()) == spec
    assert seen == set(MUTATIONS)  # every kind of mutation happens
    assert _chain(3) == _chain(3)  # seeded: the same variants again


def test_condition_rephrasing_round_trips_and_llm_rewrites_are_checked():
    spec = PromptSpec(rules=IMPLIED_RULES)
    once = MUTATIONS["rephrase_condition"](spec, np.random.default_rng(0))
    assert once.rules[3] == "Recommend no trade and say why when the headline gives nothing to trade."
    assert MUTATIONS["rephrase_condition"](once, np.random.default_rng(0)).rules[3] == IMPLIED_RULES[3]
    rule = IMPLIED_RULES[0]
    assert acceptable_rewrite(
        rule, "Use the sections Trade Recommendation, Rationale, Risk Factors, Timeframe, Position Size, Stop Loss"
    ).endswith("Stop Loss.")
    assert acceptable_rewrite(rule, "Write the sections in order.") is None  # the section names went missing
    assert acceptable_rewrite(rule, "line one\nline two") is None and acceptable_rewrite(rule, rule) is None


def test_a_real_llm_writes_rules_tiny_local_does_not(smollm2_dir, model_backend):
    """SmolLM2-135M-Instruct (offline, a real instruct LLM) rewrites a rule; tiny-local gets no writer."""
    from outcome_flywheel.daily_rl.judge.llm_judge import Judge
    from outcome_flywheel.daily_rl.policy.prompt_evolver import prompt_writer
    from outcome_flywheel.daily_rl.policy.prompt_variants import LLMWriter
    from outcome_flywheel.models.torch.backend import TorchBackend

    assert prompt_writer(model_backend, Judge()) is None  # tiny-local cannot write prompts
    writer = LLMWriter(TorchBackend(smollm2_dir, device="cpu"), "smollm2-135m-instruct")
    rewritten = writer.rewrite(IMPLIED_RULES[0], "rephrase_rule")
    assert rewritten and rewritten != IMPLIED_RULES[0] and all(s in rewritten for s in NOTE_SECTIONS)
    # seed 0 draws tighten_wording of the first rule: the LLM writes it (greedy, so always the same text)
    spec, name, by = mutate(PromptSpec(rules=IMPLIED_RULES), np.random.default_rng(0), writer)
    assert (name, by) == ("tighten_wording", "llm:smollm2-135m-instruct") and spec.rules[1:] == IMPLIED_RULES[1:]
    assert all(s in spec.rules[0] for s in NOTE_SECTIONS)


# -- the bandit ---------------------------------------------------------------------------------
def _trials(day: str, assigned: dict[str, str], rewards: dict[str, float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """rollouts of the day before `day` (one row per headline) and their scores, as the loop writes them."""
    rollouts = pd.DataFrame(
        [
            dict(date="prev", headline_id=h, title=f"title {h}", summary="", prompt_version=v)
            for h, v in assigned.items()
        ]
    )
    scores = pd.DataFrame(
        [
            dict(headline_id=h, rollout_index=k, usable=True, reward=rewards[h] + 0.01 * k)
            for h in assigned
            for k in range(2)
        ]
    )
    return rollouts, scores


def test_trials_intervals_epsilon_ucb_and_adoption():
    config = EvolverConfig(trials_per_variant=4, heldout=5, min_pulls_for_best=2)
    ev = PromptEvolver("2025-01-02", config, 7, [], pd.DataFrame())
    heads = [f"h{i}" for i in range(6)]
    assert ev.assign(heads) == ["base"] * 6  # one arm
    rollouts, scores = _trials(
        "2025-01-03", {h: "base" for h in heads}, {h: 0.5 + 0.02 * i for i, h in enumerate(heads)}
    )
    ev = PromptEvolver("2025-01-03", config, 7, ev.variants, ev.experiences)
    assert ev.record(rollouts, scores) == 6 and ev.trials == 6
    assert len(ev.experiences) == 5  # the held-out set: the last `heldout` scored headlines
    # due (6 >= 4): a candidate from the best, adopted only if not worse on the held-out set
    calls = []

    def heldout(system: str, experiences: pd.DataFrame) -> np.ndarray:
        calls.append(system)
        return np.full(len(experiences), 0.6 if system != SYSTEM_PROMPT else 0.5)

    cand = ev.evolve(heldout)
    assert cand["status"] == "live" and cand["parent"] == "base" and cand["heldout_diff"] == pytest.approx(0.1)
    assert calls[1] == SYSTEM_PROMPT and not ev.due()  # the next one after 8 trials
    mean, low, high = interval(
        6,
        *(lambda r: (sum(r), sum(x * x for x in r)))(
            [float(scores[scores.headline_id == h].reward.mean()) for h in heads]
        ),
    )
    base = ev.frames()[0].set_index("version").loc["base"]
    assert base.reward_mean == pytest.approx(mean) and base.ci_low == pytest.approx(low) and low < mean < high
    # UCB1 tries the unpulled arm first; pending pulls spread the rest of the day
    picks = ev.assign(heads)
    assert set(picks) == {"base", cand["version"]}
    again = PromptEvolver("2025-01-03", config, 7, [dict(v, pending=0) for v in ev.variants], ev.experiences)
    assert again.assign(heads) == picks  # seeded by (seed, day)
    # a worse candidate is rejected and never assigned
    rollouts, scores = _trials("2025-01-04", dict(zip(heads, picks)), {h: 0.55 for h in heads})
    ev = PromptEvolver("2025-01-04", config, 7, ev.variants, ev.experiences)
    ev.record(rollouts, scores)
    live_prompts = {v["system_prompt"] for v in ev.live()}
    worse = ev.evolve(lambda system, e: np.full(len(e), 0.5 if system in live_prompts else 0.3))  # the candidate: 0.3
    assert worse["status"] == "rejected" and worse["heldout_diff"] == pytest.approx(-0.2)
    assert worse["version"] not in ev.assign(heads * 5)
    table = variant_table(ev.frames()[0])
    assert "rejected" in table and "(best)" in table


def test_at_most_max_live_and_epsilon_explores():
    config = EvolverConfig(trials_per_variant=1, max_live=3, heldout=3, min_pulls_for_best=1, epsilon=1.0)
    ev = PromptEvolver("2025-01-02", config, 1, [], pd.DataFrame())
    for i in range(6):
        day = f"2025-01-{i + 3:02d}"
        assigned = dict(zip(["a", "b", "c"], ev.assign(["a", "b", "c"])))
        rollouts, scores = _trials(day, assigned, {"a": 0.4, "b": 0.5, "c": 0.6})
        ev = PromptEvolver(day, config, 1, ev.variants, ev.experiences)
        ev.record(rollouts, scores)
        while ev.due():
            ev.evolve(lambda system, e: np.full(len(e), 0.5))  # ties: "not worse" adopts
        assert len(ev.live()) <= 3 and "base" in {v["version"] for v in ev.live()}
    assert any(v["status"] == "retired" for v in ev.variants)
    # epsilon = 1: uniform over the live arms, whatever UCB1 says
    picks = ev.assign([f"h{i}" for i in range(300)])
    counts = pd.Series(picks).value_counts()
    assert len(counts) == 3 and counts.min() > 60


# -- two days of daily_update on tiny-local ---------------------------------------------------------
def _run(res, day, run_config=EVOLVE):
    return dg.materialize(
        [headlines, daily_update, baseline_rollouts], partition_key=day, resources=res, run_config=run_config
    )


@pytest.fixture(scope="module")
def evolved(tmp_path_factory, tiny_model_dir):
    root = linked_data_dir(tmp_path_factory.mktemp("evolver"), tiny_model_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLYWHEEL_DATA_DIR", str(root))
        res = daily_resources(root)
        results = {day: _run(res, day) for day in DAYS}
        yield root, res, results


def test_a_variant_is_written_tested_and_sampled(evolved):
    root, res, results = evolved
    wh = res["warehouse"]
    assert all(r.success for r in results.values())
    first = wh.read("prompt_evolver", DAYS[0])
    assert list(first["version"]) == ["base"] and int(first["pending"].iloc[0]) == 3
    state = wh.read("prompt_evolver", DAYS[1])
    assert int(state["pulls"].sum()) == 3  # day 1's three groups, scored on day 2
    written = state[state["version"] != "base"]
    assert len(written) == 1 and written["heldout_n"].iloc[0] == 3 and written["status"].iloc[0] in ("live", "rejected")
    assert len(wh.read("prompt_experiences", DAYS[1])) == 3
    meta = results[DAYS[1]].asset_materializations_for_node("daily_update")
    evolver_meta = [m.metadata for m in meta if m.asset_key.to_user_string() == "prompt_evolver"][0]
    assert "mean reward" in evolver_meta["variants"].value and evolver_meta["trials"].value == 3
    rollouts = wh.read("rollouts", DAYS[1])
    systems = dict(zip(state["version"], state["system_prompt"]))
    for version, prompt in zip(rollouts["prompt_version"], rollouts["prompt"]):
        assert json.loads(prompt)[0]["content"] == systems[version]  # the stored prompt is the variant's
    baseline = wh.read("baseline_rollouts", DAYS[1])
    assert {json.loads(p)[0]["content"] for p in baseline["prompt"]} == {SYSTEM_PROMPT} and set(
        baseline["prompt_version"]
    ) == {"base"}
    assert "prompt evolver (2025-11-04): 3 trials, 1 candidates" in prompt_evolver_summary(root)


def test_gspo_trains_on_the_prompt_the_note_was_sampled_under(evolved, tmp_path_factory):
    root, res, _ = evolved
    wh = res["warehouse"]
    rollouts = wh.read("rollouts", DAYS[1])
    state = wh.read("prompt_evolver", DAYS[1])
    variant = state[(state["version"] != "base") & (state["status"] == "live")]
    if variant.empty:  # the candidate was rejected on the held-out set: sample one group under it here
        variant = state[state["version"] != "base"]
    system = variant["system_prompt"].iloc[0]
    assert system != SYSTEM_PROMPT
    from outcome_flywheel.daily_rl.policy.checkpoints import load_policy, read_checkpoint
    from outcome_flywheel.daily_rl.policy.rollouts import generate_rollouts

    ckpt = root / "checkpoints" / "policy" / DAYS[1]
    policy = load_policy(res["model_backend"], ckpt, read_checkpoint(ckpt))
    todays = wh.read("headlines", DAYS[1]).head(2)
    sampled = generate_rollouts(
        policy,
        todays,
        DAYS[1],
        0,
        2,
        24,
        "x",
        [variant["version"].iloc[0], "base"],
        {variant["version"].iloc[0]: system},
    )
    ours = sampled[sampled["prompt_version"] != "base"]
    scores = ours.assign(advantage=[1.0, -1.0], usable=True)
    examples = training_examples(ours, scores)
    assert all(e.prompt[0]["content"] == system for e in examples)  # GSPO's prompt = the sampling prompt
    forced = policy.response_logprobs([e.prompt for e in examples], [e.response_ids for e in examples], temperature=0.8)
    base_prompts = [trading_note_messages(t, s) for t, s in zip(ours["title"], ours["summary"])]
    under_base = policy.response_logprobs(base_prompts, [e.response_ids for e in examples], temperature=0.8)
    gap = max(float(np.max(np.abs(np.asarray(e.behavior_logprobs) - f))) for e, f in zip(examples, forced))
    wrong = max(float(np.mean(np.abs(np.asarray(e.behavior_logprobs) - f))) for e, f in zip(examples, under_base))
    assert gap < 1e-4 < wrong  # pi_old under the sampling prompt; the base prompt would be another distribution
    assert set(rollouts["prompt_version"]) <= set(state["version"])


def test_a_rerun_of_a_day_reproduces_the_state(evolved):
    root, res, _ = evolved
    wh = res["warehouse"]
    before = wh.read("prompt_evolver", DAYS[1])
    assigned = wh.read("rollouts", DAYS[1])[["headline_id", "rollout_index", "prompt_version"]]
    assert _run(res, DAYS[1]).success
    after = wh.read("prompt_evolver", DAYS[1])
    pd.testing.assert_frame_equal(before, after)
    pd.testing.assert_frame_equal(
        assigned, wh.read("rollouts", DAYS[1])[["headline_id", "rollout_index", "prompt_version"]]
    )
