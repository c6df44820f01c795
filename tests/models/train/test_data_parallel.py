"""Data-parallel training under torchrun (`models/torch/training.py`, `models/train/shards.py`): GSPO
(the token objective with its whole-note part), weighted DPO and SFT in 2 processes (gloo, CPU) take
the same step as in 1 process on the same minibatch: the same loss, gradient and weights, within what
fp32 rounding allows between two batch shapes of one forward (the bounds of tests/models/train/test_micro_batches.py,
tests/tolerances.py; the all-reduce only reorders one more sum).

Each rank's shard is checked directly (the examples each rank's gradient passes saw: disjoint, together
the minibatch, a GSPO prompt group on one rank), and `FLYWHEEL_DEBUG_WRONG_SHARD=0` (both ranks train
rank 0's shard) must fail the equality: the bounds are tight enough to see it. Rank 1 writes nothing
(`TorchBackend.save` is called on every rank; only rank 0's folder appears), and a rank killed mid-step
(`FLYWHEEL_TRAIN_CRASH_RANK=1`) fails the run with a nonzero exit and the reason, publishing nothing.

Rollout sampling across the ranks gives the one-process notes (same tokens, log-probs within their bound),
and a wrong sampling shard fails the run.

This file is also the worker torchrun starts: `python -m tests.models.train.test_data_parallel OUT MODEL TRAINERS`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import PROJECT_ROOT

TRAINERS = ("gspo", "dpo", "sft", "gspo_full")  # gspo_full: every weight trains (lora=None, fp32 master weights)


def gspo_full_case(backend):
    """tests/test_micro_batches.gspo_case with a full fine-tune (every weight trains, no adapter)."""
    from outcome_flywheel.models.train.gspo import train_gspo
    from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample
    from tests.models.train.test_micro_batches import ADVANTAGES, gspo_case

    prompts, responses, weights, _ = gspo_case(backend)
    behaviour = backend.response_logprobs(prompts, responses)
    examples = [
        GSPOExample(p, r, [float(x) for x in b], a, token_advantages=[0.5 * a] * len(r))
        for p, r, b, a in zip(prompts, responses, behaviour, ADVANTAGES)
    ]
    config = GSPOConfig(batch_size=6, epochs=1, temperature=1.0, lora=None)
    return prompts, responses, weights, lambda be: train_gspo(be, examples, config)


def cases():
    from tests.models.train.test_micro_batches import dpo_case, gspo_case, sft_case

    return {"gspo": gspo_case, "dpo": dpo_case, "sft": sft_case, "gspo_full": gspo_full_case}


def row_key(row) -> str:
    """A response (token ids) or a completion's segments (lists of ids) as a string."""
    if row and isinstance(row[0], (list, tuple)):
        return repr([list(map(int, s)) for s in row])
    return repr(list(map(int, row)))


def spy(backend, seen: list) -> None:
    """Record the rows each gradient-carrying forward of the trainer took (the rank's shard): GSPO's and
    SFT's responses, DPO's rejected completions (the second half of its one forward over both)."""
    import torch

    for name in ("batch_logprobs", "batch_logprobs_hidden", "sequence_logps"):  # a row seen twice counts once
        original = getattr(backend, name)

        def wrapped(prompts, rows, *args, _original=original, _name=name, **kwargs):
            if torch.is_grad_enabled():
                seen.extend(row_key(r) for r in (rows[len(rows) // 2 :] if _name == "sequence_logps" else rows))
            return _original(prompts, rows, *args, **kwargs)

        setattr(backend, name, wrapped)


def example_keys(trainer: str, backend, responses) -> list[str]:
    """Each example's key as `spy` records it (DPO: the pairs of tests/test_micro_batches.dpo_case)."""
    if trainer != "dpo":  # GSPO's responses, SFT's completions
        return [row_key(r) for r in responses]
    from outcome_flywheel.models.segments import encode_segments
    from outcome_flywheel.models.train.dpo_config import WeightedDPOConfig
    from tests.mlx_fixtures import RESPONSES

    unit = WeightedDPOConfig().completion_unit
    rejected = [RESPONSES[(i + 1) % 3] + " now" * i for i in range(4)]
    return [row_key(encode_segments(backend.encode_response, text, unit)) for text in rejected]


def train_one(trainer: str, model_dir: Path, out: Path) -> dict:
    """One optimiser step of `trainer` on the fixed case, in this process's data-parallel group; every
    rank's figures, what each rank's forwards saw and its weights' digest; rank 0 keeps grads and weights."""
    import torch

    from outcome_flywheel.models.loader import load_backend
    from outcome_flywheel.models.torch import training as distributed

    rank, world = distributed.world()
    backend = load_backend("torch", model_dir, device="cpu")
    prompts, responses, weights, train = cases()[trainer](backend)
    if os.environ.get("DP_TEST_PERTURB_RANK") == str(rank):  # a rank whose copy of the policy is off
        import torch

        with torch.no_grad():
            next(backend.model.parameters()).view(-1)[0] += 1e-3
    seen: list = []
    spy(backend, seen)
    backend.framework.seed(1)
    stats = train(backend)
    params = dict(backend.model.named_parameters())
    trainable = {k: p for k, p in params.items() if p.requires_grad}
    grads = {k: p.grad.detach().double().numpy() for k, p in trainable.items() if p.grad is not None}
    weights_now = {k: p.detach().double().numpy() for k, p in trainable.items()}
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in trainable.values())).hexdigest()
    backend.save(out / "checkpoint" / trainer / f"rank{rank}")  # only rank 0 writes
    every = distributed.gather({"seen": seen, "digest": digest})
    rows = example_keys(trainer, backend, responses)
    result = {
        "losses": stats.losses,
        "grad_norms": stats.grad_norms,
        "steps": stats.steps,
        "metrics": {
            k: v
            for k, v in stats.extra.items()
            if isinstance(v, list) and v and isinstance(v[0], float) and k != "is_ratio_by_example"
        },
        "seen": [sorted({rows.index(s) for s in e["seen"] if s in rows}) for e in every],
        "digests": [e["digest"] for e in every],
        "world": world,
        "reference_batches": stats.extra.get("reference_batches_by_rank"),
    }
    if rank == 0:
        np.savez(
            out / f"{trainer}-w{world}.npz",
            **{f"g:{k}": v for k, v in grads.items()},
            **{f"w:{k}": v for k, v in weights_now.items()},
        )
    return result


def led_sft(model_dir: Path, lead: bool) -> float:
    """SFT on a policy that already carries a trained-looking adapter, as a step's rank 0 runs it; with
    `lead`, the other ranks join through `followers.follow` (the step's way, steps/entry.py). Its loss."""
    import torch

    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.loader import load_backend
    from outcome_flywheel.models.torch import followers
    from outcome_flywheel.models.train.shards import LEADERS

    backend = load_backend("torch", model_dir, device="cpu")
    backend.framework.seed(5)
    backend.add_lora(LoraSettings(r=4, alpha=8))
    with torch.no_grad():  # B = 0 at init: give the adapter weights of its own
        for name, p in backend.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(len(name)))
    _, _, _, train = cases()["sft"](backend)
    LEADERS.extend([followers.lead] if lead else [])
    try:
        return train(backend).losses[0]
    finally:
        LEADERS.clear()


def resumed_gspo(model_dir: Path, parent: Path, lead: bool) -> list[float]:
    """The GSPO case again on `parent` (an adapter saved with its AdamW moments), as a step's rank 0
    runs it; with `lead`, the other ranks join through `followers.follow`. Its losses."""
    from outcome_flywheel.models.loader import load_backend
    from outcome_flywheel.models.torch import followers
    from outcome_flywheel.models.train.shards import LEADERS

    backend = load_backend("torch", model_dir, adapter_path=parent, device="cpu")
    assert backend.optimizer_tensors is not None
    _, _, _, train = cases()["gspo"](backend)
    LEADERS.extend([followers.lead] if lead else [])
    try:
        return train(backend).losses
    finally:
        LEADERS.clear()


SAMPLED_HEADLINES = 5  # odd: the ranks' shards differ in size
SAMPLES_PER_HEADLINE, SAMPLED_TOKENS = 3, 24


def sampling_policy(model_dir: Path):
    """tiny-local with an adapter of its own (B drawn, not zero): a follower must mirror it to sample the same notes."""
    import torch

    from outcome_flywheel.models.interface import LoraSettings
    from outcome_flywheel.models.loader import load_backend

    backend = load_backend("torch", model_dir, device="cpu")
    backend.framework.seed(5)
    backend.add_lora(LoraSettings(r=4, alpha=8))
    with torch.no_grad():
        for name, p in backend.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return backend


def sampled_headlines():
    import pandas as pd

    words = ["Chipmaker beats estimates", "Oil slides on supply glut", "Bank raises its dividend"]
    return pd.DataFrame(
        {
            "headline_id": [f"h{i}" for i in range(SAMPLED_HEADLINES)],
            "title": [words[i % 3] + " again" * i for i in range(SAMPLED_HEADLINES)],
            "summary": ["Shares moved after the report." * (1 + i % 2) for i in range(SAMPLED_HEADLINES)],
        }
    )


def sample_day(model_dir: Path, lead: bool):
    """The day's rollouts of `sampled_headlines` on `sampling_policy`, as the daily step samples them; with
    `lead`, on rank 0 of a data-parallel step (the other ranks sample their shares through `followers.follow`)."""
    from outcome_flywheel.daily_rl.policy.rollouts import generate_rollouts
    from outcome_flywheel.models.torch import followers
    from outcome_flywheel.models.train.shards import LEADERS

    backend = sampling_policy(model_dir)
    LEADERS.extend([followers.lead] if lead else [])
    try:
        return generate_rollouts(
            backend, sampled_headlines(), "2026-03-02", 11, SAMPLES_PER_HEADLINE, SAMPLED_TOKENS, "v"
        )
    finally:
        LEADERS.clear()


LED = ("follow", "sample", "resume")  # the modes where rank 0 leads a call and the other ranks follow it


def led(mode: str, rank: int, out: Path, model_dir: Path) -> None:
    """One led call: rank 0 runs it and ends it with `followers.finish()`, the others join it through `followers.follow`.
    `follow`: an SFT on an adapter-bearing policy; `sample`: a day's rollouts, each rank sampling its share;
    `resume`: a GSPO that resumes saved AdamW moments (DP_TEST_PARENT)."""
    from outcome_flywheel.models.torch import followers
    from outcome_flywheel.steps.entry import _policy

    if rank == 0:
        if mode == "follow":
            (out / "follow.json").write_text(json.dumps({"loss": led_sft(model_dir, lead=True)}))
        elif mode == "resume":
            loss = resumed_gspo(model_dir, Path(os.environ["DP_TEST_PARENT"]), lead=True)
            (out / "resume.json").write_text(json.dumps({"loss": loss}))
        else:
            rollouts = sample_day(model_dir, lead=True)
            rollouts.to_parquet(out / "rollouts-w2.parquet")
        followers.finish()
        return
    if mode != "sample":
        assert followers.follow(_policy) == 1
        return
    seeds: list[int] = []

    def recorded(spec):  # the seeds of the prompts this rank sampled itself
        backend = _policy(spec)
        sample = backend.sample
        backend.sample = lambda prompts, n, config, s: seeds.extend(s) or sample(prompts, n, config, s)
        return backend

    assert followers.follow(recorded) == 1
    (out / f"rank{rank}-seeds.json").write_text(json.dumps(seeds))


def worker(out: Path, model_dir: Path, trainers: list[str]) -> None:
    """torchrun's entry: every trainer in turn (rank 0 publishes their results once all trained), then each
    led mode (`LED`) in turn: one launch checks several things, since a launch is mostly its imports."""
    from outcome_flywheel.models.torch.training import init_from_env

    rank, world = init_from_env("cpu")
    plain = [t for t in trainers if t not in LED]
    if plain:
        results = {t: train_one(t, model_dir, out) for t in plain}
        if rank == 0:
            (out / f"results-w{world}.json").write_text(json.dumps(results))
    for mode in (t for t in trainers if t in LED):
        led(mode, rank, out, model_dir)


def torchrun(out: Path, model_dir: Path, trainers, launcher: str = "torchrun", **env) -> subprocess.CompletedProcess:
    """This file's worker in 2 processes, started by the project's own command line for `launcher`
    (`steps/launch.py`: torchrun, or accelerate)."""
    from outcome_flywheel.steps.launch import StepLaunch

    command = StepLaunch(launcher=launcher, processes=2, python=sys.executable).module_command(
        "tests.models.train.test_data_parallel", str(out), str(model_dir), ",".join(trainers)
    )
    environ = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_TRAIN_MEMORY_GIB"}
    environ.update(OMP_NUM_THREADS="1", **env)
    return subprocess.run(command, cwd=PROJECT_ROOT, env=environ, capture_output=True, text=True, timeout=900)


def one_process(out: Path, model_dir: Path, trainers, monkeypatch) -> dict:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("FLYWHEEL_TRAIN_MEMORY_GIB", raising=False)
    return {t: train_one(t, model_dir, out) for t in trainers}


def bounds_of(trainer: str, model_dir: Path) -> tuple[float, float]:
    """(loss, gradient) bounds of two fp32 evaluations of the case's step (tests/models/train/test_micro_batches.py)."""
    from outcome_flywheel.models.loader import load_backend
    from tests.models.train.test_micro_batches import bounds

    backend = load_backend("torch", model_dir, device="cpu")
    prompts, responses, weights, _ = cases()[trainer](backend)
    if trainer != "gspo_full":
        from outcome_flywheel.models.interface import LoraSettings

        backend.framework.seed(1)
        backend.add_lora(LoraSettings())
    return bounds(backend, prompts, responses, weights)


def weight_bound(g: np.ndarray, w: np.ndarray, grad_bound: float, lr: float) -> np.ndarray:
    """Per weight, how far one AdamW step (its first: u = lr g / (|g| + eps), g the clipped gradient)
    moves between two gradients within `grad_bound` of each other (a clip by factors within it of each
    other at most doubles that): |du/dg| = lr eps / (|g| + eps)^2 over the interval, never above 2 lr,
    plus the rounding of w + u."""
    eps, d = 1e-8, 2.0 * grad_bound
    near = np.maximum(np.abs(g) - d, 0.0)
    return np.minimum(lr * eps * d / (near + eps) ** 2, 2.0 * lr) + 4 * 2.0**-24 * (np.abs(w) + lr)


def compare(trainer: str, one: dict, two: dict, out: Path, loss_bound: float, grad_bound: float) -> list[str]:
    """What differs between the 1- and 2-process steps beyond the bounds (empty: the same update)."""
    problems = []
    if abs(one["losses"][0] - two["losses"][0]) > loss_bound:
        problems.append(f"loss {one['losses']} vs {two['losses']} (bound {loss_bound:.3g})")
    if abs(one["grad_norms"][0] - two["grad_norms"][0]) > grad_bound:
        problems.append(f"grad norm {one['grad_norms']} vs {two['grad_norms']} (bound {grad_bound:.3g})")
    a, b = np.load(out / f"{trainer}-w1.npz"), np.load(out / f"{trainer}-w2.npz")
    grads = [k for k in a.files if k.startswith("g:")]
    diff = math.sqrt(sum(float(((a[k] - b[k]) ** 2).sum()) for k in grads))
    if set(grads) != {k for k in b.files if k.startswith("g:")} or diff > 2 * grad_bound:
        problems.append(f"gradients differ by {diff:.3g} (bound {2 * grad_bound:.3g})")
    for k in (k for k in a.files if k.startswith("w:")):
        bound = weight_bound(a["g:" + k[2:]], a[k], grad_bound, learning_rate(trainer))
        if np.any(np.abs(a[k] - b[k]) > bound):
            problems.append(f"weights {k[2:]} differ by {float(np.abs(a[k] - b[k]).max()):.3g}")
            break
    # metrics that are means over sequences or pairs (the shares the ranks' parts are weighted by): a
    # log-prob of tiny-local is within ~1e-5 of another fp32 evaluation (tests/tolerances.py); a wrong
    # shard moves these by ~1e-2 or more (not rewards_accuracy: a step function of margins that start at 0)
    for name in ("mean_logp", "rewards_margin", "rewards_chosen", "rewards_rejected"):
        if name in one["metrics"] and abs(one["metrics"][name][0] - two["metrics"][name][0]) > 1e-4:
            problems.append(f"{name} {one['metrics'][name]} vs {two['metrics'][name]}")
    return problems


def learning_rate(trainer: str) -> float:
    """The case's AdamW learning rate (tests/models/train/test_micro_batches.py's cases take the configs' defaults)."""
    from outcome_flywheel.models.train.dpo_config import WeightedDPOConfig
    from outcome_flywheel.models.train.gspo_config import GSPOConfig
    from outcome_flywheel.models.train.sft_config import SFTConfig

    configs = {"gspo": GSPOConfig, "dpo": WeightedDPOConfig, "sft": SFTConfig, "gspo_full": GSPOConfig}
    return configs[trainer]().learning_rate


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """The 2-process run of every trainer (torchrun, gloo) and then of each led mode (`LED`; `resume` on a parent
    saved here), and the 1-process reference of the trainers."""
    out = tmp_path_factory.mktemp("dp")
    with pytest.MonkeyPatch.context() as mp:
        save_resumable_parent(tiny_model_dir, out / "parent", mp)
    done = torchrun(out, tiny_model_dir, [*TRAINERS, *LED], DP_TEST_PARENT=str(out / "parent"))
    assert done.returncode == 0, done.stderr[-4000:]
    with pytest.MonkeyPatch.context() as mp:
        one = one_process(out, tiny_model_dir, TRAINERS, mp)
    two = json.loads((out / "results-w2.json").read_text())
    return out, one, two


@pytest.mark.parametrize("trainer", TRAINERS)
def test_two_processes_take_the_one_process_step(runs, tiny_model_dir, trainer):
    out, one, two = runs
    one, two = one[trainer], two[trainer]
    assert two["world"] == 2 and one["world"] == 1 and one["steps"] == two["steps"] == 1
    loss_bound, grad_bound = bounds_of(trainer, tiny_model_dir)
    assert compare(trainer, one, two, out, loss_bound, grad_bound) == []
    # both ranks hold the same weights after the step
    assert len(set(two["digests"])) == 1
    # the shards: disjoint, together every example, uneven where the groups are
    seen = two["seen"]
    assert not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == list(range(len(one["seen"][0])))
    assert sorted(map(len, seen)) == {"gspo": [2, 4], "dpo": [2, 2], "sft": [2, 3], "gspo_full": [2, 4]}[trainer]
    if trainer == "dpo":  # the reference pass, 2 batches of 2 pairs: one each
        assert one["reference_batches"] == [2] and two["reference_batches"] == [1, 1]
    if trainer.startswith("gspo"):  # a prompt group (example i and i + 3 share PROMPTS[i % 3]) stays on one rank
        assert all((i in s) == (i + 3 in s) for s in seen for i in range(3))
    # rank 0 alone wrote its checkpoint
    assert (out / "checkpoint" / trainer / "rank0").is_dir() and not (out / "checkpoint" / trainer / "rank1").exists()


def test_accelerate_starts_two_processes_that_take_the_one_process_step(runs, tiny_model_dir, tmp_path):
    """`FLYWHEEL_STEP_LAUNCHER=accelerate` with 2 processes on a CPU: 2 ranks (accelerate without
    --multi_gpu would start one), and the one-process SFT step."""
    done = torchrun(tmp_path, tiny_model_dir, ["sft"], launcher="accelerate")
    assert done.returncode == 0, done.stderr[-4000:]
    two = json.loads((tmp_path / "results-w2.json").read_text())["sft"]
    assert two["world"] == 2 and sorted(map(len, two["seen"])) == [2, 3]
    (tmp_path / "sft-w1.npz").write_bytes((runs[0] / "sft-w1.npz").read_bytes())
    loss_bound, grad_bound = bounds_of("sft", tiny_model_dir)
    assert compare("sft", runs[1]["sft"], two, tmp_path, loss_bound, grad_bound) == []


@pytest.fixture(scope="module")
def micro_runs(runs, tiny_model_dir, tmp_path_factory):
    """The 2-process run again, each rank's shard in micro-batches of one sequence (memory.py)."""
    out = tmp_path_factory.mktemp("dp-micro")
    done = torchrun(out, tiny_model_dir, TRAINERS[:3], FLYWHEEL_TRAIN_MEMORY_GIB="1e-6")
    assert done.returncode == 0, done.stderr[-4000:]
    for trainer in TRAINERS[:3]:
        (out / f"{trainer}-w1.npz").write_bytes((runs[0] / f"{trainer}-w1.npz").read_bytes())
    return out, runs[1], json.loads((out / "results-w2.json").read_text())


@pytest.mark.parametrize("trainer", TRAINERS[:3])
def test_micro_batches_on_two_processes_take_the_one_process_step(micro_runs, tiny_model_dir, trainer):
    out, one, two = micro_runs
    loss_bound, grad_bound = bounds_of(trainer, tiny_model_dir)
    assert compare(trainer, one[trainer], two[trainer], out, loss_bound, grad_bound) == []
    assert len(set(two[trainer]["digests"])) == 1


def test_a_wrong_shard_fails_the_equality(runs, tiny_model_dir, tmp_path):
    """Both ranks on rank 0's shard (FLYWHEEL_DEBUG_WRONG_SHARD=0): the same checks must see it."""
    out, one, _ = runs
    done = torchrun(tmp_path, tiny_model_dir, ["dpo"], FLYWHEEL_DEBUG_WRONG_SHARD="0")
    assert done.returncode == 0, done.stderr[-4000:]
    wrong = json.loads((tmp_path / "results-w2.json").read_text())["dpo"]
    assert wrong["seen"][0] == wrong["seen"][1] == runs[2]["dpo"]["seen"][0]
    (tmp_path / "dpo-w1.npz").write_bytes((out / "dpo-w1.npz").read_bytes())
    loss_bound, grad_bound = bounds_of("dpo", tiny_model_dir)
    problems = compare("dpo", one["dpo"], wrong, tmp_path, loss_bound, grad_bound)
    assert any(p.startswith("loss") for p in problems) and any(p.startswith("gradients") for p in problems), problems


def test_a_rank_killed_mid_step_fails_the_run_and_publishes_nothing(tiny_model_dir, tmp_path):
    done = torchrun(tmp_path, tiny_model_dir, ["sft"], FLYWHEEL_TRAIN_CRASH_RANK="1")
    assert done.returncode != 0
    assert "FLYWHEEL_TRAIN_CRASH_RANK=1: rank 1 killing itself mid-step" in done.stderr
    assert "SIGKILL" in done.stderr or "exitcode" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "results-w2.json").exists() and not (tmp_path / "checkpoint").exists()


def test_followers_mirror_an_adapter_bearing_policy(runs, tiny_model_dir, monkeypatch):
    """A step's rank 1 joins rank 0's trainer on a copy of its policy (base, adapter layout and weights):
    the weights agree on both ranks after training (else `check_same_weights` fails the run) and the loss
    is the one-process loss."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("FLYWHEEL_TRAIN_MEMORY_GIB", raising=False)
    one = led_sft(tiny_model_dir, lead=False)
    loss_bound, _ = bounds_of("sft", tiny_model_dir)
    assert abs(json.loads((runs[0] / "follow.json").read_text())["loss"] - one) <= loss_bound


def save_resumable_parent(model_dir: Path, parent: Path, monkeypatch) -> None:
    """An adapter with its AdamW moments: the GSPO case's step in one process, saved to `parent`."""
    from outcome_flywheel.models.loader import load_backend

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("FLYWHEEL_TRAIN_MEMORY_GIB", raising=False)
    backend = load_backend("torch", model_dir, device="cpu")
    backend.framework.seed(1)
    cases()["gspo"](backend)[3](backend)
    backend.save(parent)


def test_followers_resume_the_saved_adamw_moments(runs, tiny_model_dir, monkeypatch):
    """A GSPO resuming its parent's AdamW moments: rank 0 sends them to the other ranks as tensors (not in
    the pickled control message). A rank without them would take another step: its weights would differ
    from rank 0's and the run fail (`check_same_weights`)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("FLYWHEEL_TRAIN_MEMORY_GIB", raising=False)
    one = resumed_gspo(tiny_model_dir, runs[0] / "parent", lead=False)
    loss_bound, _ = bounds_of("gspo", tiny_model_dir)
    two = json.loads((runs[0] / "resume.json").read_text())["loss"]
    assert len(one) == len(two) and all(abs(a - b) <= loss_bound for a, b in zip(one, two))


def test_ranks_that_start_from_different_weights_fail_the_run(tiny_model_dir, tmp_path):
    done = torchrun(tmp_path, tiny_model_dir, ["sft"], DP_TEST_PERTURB_RANK="1")
    assert done.returncode != 0 and "the ranks' weights differ after training" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "results-w2.json").exists()


def test_mlx_refuses_several_processes(monkeypatch):
    from outcome_flywheel.models.interface import Framework
    from outcome_flywheel.models.train.shards import ranks

    fw = Framework(
        name="mlx",
        seed=None,
        inference=None,
        to_numpy=None,
        as_array=None,
        gspo_loss=None,
        weighted_dpo_loss=None,
        adamw=None,
        train=None,
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="WORLD_SIZE=2: mlx trains in one process"):
        ranks(fw)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert ranks(fw) == (0, 1)


def test_shards_keep_groups_and_cover_the_minibatch():
    from outcome_flywheel.models.train.shards import shard

    items, keys = list(range(7)), ["a", "b", "a", "c", "c", "c", "d"]
    parts = [shard(items, keys, r, 2) for r in range(2)]
    assert parts == [[0, 2, 6], [1, 3, 4, 5]] and shard(items, keys, 0, 1) == items
    assert [shard(list(range(5)), range(5), r, 2) for r in range(2)] == [[0, 2, 4], [1, 3]]  # DistributedSampler's


@pytest.mark.parametrize("rank", ["0", "1"])
@pytest.mark.parametrize("succeeds", [True, False])
def test_a_data_parallel_steps_ranks_end_their_process_once_it_succeeded(monkeypatch, rank, succeeds):
    """steps/entry.run_data_parallel: every rank ends a step that succeeded by `followers.end_process` (a
    barrier, then `os._exit(0)` without the interpreter's teardown, where gloo's threads aborted finished
    ranks), rank 0 after telling the others it is done; a failed step ends nothing itself, since
    another rank may be inside a collective (the launcher stops them)."""
    import contextlib

    from outcome_flywheel.models.torch import followers, training
    from outcome_flywheel.steps import entry

    calls: list[str] = []
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(training, "init_from_env", lambda: calls.append("init"))
    monkeypatch.setattr(followers, "finish", lambda: calls.append("finish"))
    monkeypatch.setattr(followers, "end_process", lambda: calls.append("end"))

    def follow(policy):
        calls.append("follow")
        if not succeeds:
            raise RuntimeError("rank 0 went away")

    def run_guarded(step, pipes, run):
        calls.append("step")
        if not succeeds:
            raise RuntimeError("the step failed")

    class Log:
        info = staticmethod(lambda message: calls.append("log"))

    monkeypatch.setattr(followers, "follow", follow)
    monkeypatch.setattr(entry, "run_guarded", run_guarded)
    monkeypatch.setattr(entry, "open_step", lambda distributed: contextlib.nullcontext(type("P", (), {"log": Log})))
    if succeeds:
        entry.run_data_parallel("daily_update", lambda pipes: None)
    else:
        with pytest.raises(RuntimeError):
            entry.run_data_parallel("daily_update", lambda pipes: None)
    expected = ["init", "step", "log", "finish", "end"] if rank == "0" else ["init", "follow", "end"]
    assert calls == (expected if succeeds else expected[:2])  # nothing after the failure


def test_a_dagster_daily_update_under_torchrun_trains_and_samples_on_two_processes(
    tmp_path, tiny_model_dir, monkeypatch
):
    """The daily_update step launched as 2 processes (FLYWHEEL_STEP_LAUNCHER=torchrun, PROCESSES=2): rank 0
    runs the day and reports through Pipes, rank 1 joins its GSPO training and its rollout sampling
    (steps/entry.py). A rank killed mid-step fails the step with the reason and leaves `latest`; the
    re-run succeeds."""
    import dagster as dg

    from assets.daily_rl.daily_update import daily_update
    from assets.daily_rl.headlines import headlines
    from outcome_flywheel.models.torch.training import CRASH_RANK_VARIABLE
    from resources.steps import StepRunnerResource
    from tests.daily_fixtures import daily_resources, linked_data_dir
    from tests.pipelines.test_pipes_steps import DAYS, SMALL, _failure, _latest, _logs

    root = linked_data_dir(tmp_path, tiny_model_dir)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(root))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("FLYWHEEL_TRAIN_MEMORY_GIB", raising=False)
    runner = StepRunnerResource(runner="subprocess", launcher="torchrun", processes=2)
    res = {**daily_resources(root, max_headlines=2), "step_runner": runner}
    instance = dg.DagsterInstance.ephemeral()

    def run_day(day: str):
        return dg.materialize(
            [headlines, daily_update],
            partition_key=day,
            resources=res,
            run_config=SMALL,
            instance=instance,
            raise_on_error=False,
        )

    result = run_day(DAYS[0])
    assert result.success, _logs(instance, result)[-4000:]
    # day 2 trains: rank 1 killed in its first step fails the step with the reason, and `latest` stays
    monkeypatch.setenv(CRASH_RANK_VARIABLE, "1")
    killed = run_day(DAYS[1])
    assert not killed.success
    failure = _failure(killed)
    # the rank lost first leads; what rank 0 saw of it follows when it could report before torchrun
    # stopped it (a race: its broken collective, or nothing)
    headline = failure.split("\n")[0]
    assert "step daily_update exited with status 1: rank 1 was killed by SIGKILL" in headline, failure[-3000:]
    assert _latest(root) == DAYS[0] and not (root / "checkpoints" / "policy" / DAYS[1]).exists()
    monkeypatch.delenv(CRASH_RANK_VARIABLE)
    result = run_day(DAYS[1])
    assert result.success, _logs(instance, result)[-4000:]
    logs = _logs(instance, result)
    assert "data parallel: 2 processes trained gspo and sampled the rollouts" in logs, logs[-4000:]
    assert _latest(root) == DAYS[1]
    # each day's notes, sampled by both ranks, are those one process samples from the day's checkpoint
    # with the stored prompts and seeds: the same tokens (log-probs: test_two_processes_sample_the_one_process_notes)
    from dataclasses import replace

    from outcome_flywheel.daily_rl.policy.checkpoints import load_policy, read_checkpoint
    from outcome_flywheel.daily_rl.policy.rollouts import ROLLOUT_SAMPLING

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for day in DAYS:
        rollouts = res["warehouse"].read("rollouts", partition=day)
        folder = root / "checkpoints" / "policy" / day
        policy = load_policy(res["model_backend"], folder, read_checkpoint(folder))
        groups = rollouts.groupby("headline_id", sort=False)
        firsts = groups.first()
        n = int(groups.size().iloc[0])
        config = replace(ROLLOUT_SAMPLING, max_new_tokens=int(firsts["max_new_tokens"].iloc[0]))
        samples = policy.sample([json.loads(p) for p in firsts["prompt"]], n, config, list(firsts["seed"]))
        assert [list(r) for r in rollouts["response_ids"]] == [list(s.token_ids) for g in samples for s in g], day


def test_a_torchrun_daily_run_reaches_note_scorer_which_runs_as_one_process(tmp_path, tiny_model_dir, monkeypatch):
    """FLYWHEEL_STEP_LAUNCHER=torchrun FLYWHEEL_STEP_PROCESSES=2, as docs/deploy.md recommends for `make up`:
    a day's headlines, daily_update (2 processes) and note_scorer, whose whole body would run in each
    process: it runs as one, launched plainly, and its log and metadata say so; the day succeeds."""
    import dagster as dg

    from assets.daily_rl.daily_update import daily_update
    from assets.daily_rl.headlines import headlines
    from assets.daily_rl.note_scorer import note_scorer
    from outcome_flywheel.feedback.log import FeedbackLog
    from resources.steps import StepRunnerResource
    from tests.daily_fixtures import daily_resources, linked_data_dir
    from tests.pipelines.test_pipes_steps import DAYS, SMALL, _latest, _logs

    root = linked_data_dir(tmp_path, tiny_model_dir)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(root))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("FLYWHEEL_TRAIN_MEMORY_GIB", raising=False)
    monkeypatch.setenv("FLYWHEEL_STEP_LAUNCHER", "torchrun")
    monkeypatch.setenv("FLYWHEEL_STEP_PROCESSES", "2")
    res = {
        **daily_resources(root, max_headlines=2),
        "feedback_log": FeedbackLog(data_dir=str(root)),
        "step_runner": StepRunnerResource.from_env(),
    }
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        [headlines, daily_update, note_scorer],
        partition_key=DAYS[0],
        resources=res,
        run_config=SMALL,
        instance=instance,
        raise_on_error=False,
    )
    logs = _logs(instance, result)
    assert result.success, logs[-4000:]
    assert "data parallel: 2 processes" in logs and _latest(root) == DAYS[0]
    said = "step note_scorer: runs as one process, launched plainly (python)"
    assert said in logs, logs[-4000:]
    meta = result.asset_materializations_for_node("note_scorer")[0].metadata
    assert "runs as one process" in meta["step_launch"].value and meta["step_pid"].value != os.getpid()
    assert res["warehouse"].exists("note_features", DAYS[0])  # the day's features: the scorer ran on it


def test_two_processes_sample_the_one_process_notes(runs, tiny_model_dir, monkeypatch):
    """Rollout sampling shared out across a step's 2 ranks (`shards.sample_across_ranks`): rank 1 samples
    its headlines itself, on its copy of rank 0's adapter-bearing policy, and rank 0 gathers the notes one
    process samples from the same headlines and seeds: the same tokens, and behaviour log-probs within
    the fp32 bound of two forwards of different batch shapes (tests/tolerances.py)."""
    import pandas as pd

    from outcome_flywheel.daily_rl.policy.rollouts import generation_seed
    from tests.tolerances import assert_logprobs_close, logprob_tolerances

    two = pd.read_parquet(runs[0] / "rollouts-w2.parquet")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    one = sample_day(tiny_model_dir, lead=False)
    assert len(one) == len(two) == SAMPLED_HEADLINES * SAMPLES_PER_HEADLINE
    key = ["headline_id", "rollout_index"]
    assert list(two[key].itertuples(index=False)) == list(one[key].itertuples(index=False))
    assert [list(r) for r in two["response_ids"]] == [list(r) for r in one["response_ids"]]
    assert list(two["response"]) == list(one["response"]) and list(two["seed"]) == list(one["seed"])
    backend = sampling_policy(tiny_model_dir)
    prompts = [json.loads(p) for p in one["prompt"]]
    responses = [list(r) for r in one["response_ids"]]
    bounds = logprob_tolerances(backend, prompts, responses, temperature=0.8)
    assert_logprobs_close(
        [list(x) for x in two["behavior_logprobs"]], [list(x) for x in one["behavior_logprobs"]], bounds
    )
    ids = list(one["headline_id"].drop_duplicates())
    rank1 = sorted(json.loads((runs[0] / "rank1-seeds.json").read_text()))
    assert rank1 == sorted(generation_seed(11, "2026-03-02", h) for h in ids[1::2])  # headlines 1 and 3
    assert not list(runs[0].glob("rank1-*.parquet"))


def test_a_wrong_sampling_shard_fails_the_run(tiny_model_dir, tmp_path):
    """Both ranks sampling rank 0's headlines leave the others unsampled: the run fails with the reason."""
    done = torchrun(tmp_path, tiny_model_dir, ["sample"], FLYWHEEL_DEBUG_WRONG_SHARD="0")
    assert done.returncode != 0
    assert "data parallel sampling: prompts [1, 3] sampled by no rank, [0, 2, 4] by several" in done.stderr, (
        done.stderr[-3000:]
    )
    assert not (tmp_path / "rollouts-w2.parquet").exists()


def test_a_dagster_preference_adapter_under_torchrun_trains_dpo_on_two_processes(
    tmp_path, warehouse, model_backend, data_dir, monkeypatch
):
    """The preference_adapter step as 2 processes: rank 0 runs the step and rank 1 joins its weighted
    DPO; one adapter, one history row, the pool untouched."""
    import dagster as dg

    from assets.preferences.adapter import HISTORY_TABLE, preference_adapter
    from resources.steps import StepRunnerResource
    from tests.pipelines.test_pipes_steps import _logs, preference_pool

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("FLYWHEEL_TRAIN_MEMORY_GIB", raising=False)
    runner = StepRunnerResource(runner="subprocess", launcher="torchrun", processes=2)
    res = preference_pool(tmp_path, warehouse, model_backend, data_dir, runner)
    pool = warehouse.read("dpo_dataset")
    instance = dg.DagsterInstance.ephemeral()
    cfg = {"ops": {"preference_adapter": {"config": {"epochs": 1, "batch_size": 16}}}}
    result = dg.materialize(
        [preference_adapter], resources=res, run_config=cfg, instance=instance, raise_on_error=False
    )
    assert result.success, _logs(instance, result)[-4000:]
    assert "data parallel: 2 processes trained dpo (rank 0 ran" in _logs(instance, result)
    adapters = warehouse.path("adapters", "preference")
    assert (adapters / "latest").is_symlink() and not list(adapters.glob(".staging-*"))
    hist = warehouse.read_all(HISTORY_TABLE)
    assert hist["status"].tolist() == ["succeeded"] and hist["steps"].iloc[0] >= 1
    assert warehouse.read("dpo_dataset").equals(pool)


if __name__ == "__main__":
    worker(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(","))
    from outcome_flywheel.models.torch.followers import end_process

    end_process()  # as a step's ranks do (steps/entry.py): in the exit's teardown gloo's threads can abort a finished rank
