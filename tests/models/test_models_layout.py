"""The models package's layout holds: trainer configs (and the shared trainers, plans and
interface) import neither torch nor mlx; the torch and mlx folders mirror each other file for file
with the same public functions and parameters; no file is over 450 lines; and the batching plan
both frameworks train on is the one the trainers used before they were shared."""

from __future__ import annotations

import ast
import random
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from outcome_flywheel.models.train.batching import batch_plan
from outcome_flywheel.models.train.dpo_config import PreferencePair, WeightedDPOConfig
from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample
from tests import PROJECT_ROOT

MODELS = PROJECT_ROOT / "outcome_flywheel" / "models"
LIGHT = [
    "outcome_flywheel.models",
    "outcome_flywheel.models.interface",
    "outcome_flywheel.models.train.gspo_config",
    "outcome_flywheel.models.train.dpo_config",
    "outcome_flywheel.models.train.batching",
    "outcome_flywheel.models.train.gspo",
    "outcome_flywheel.models.train.dpo",
    "outcome_flywheel.models.train.sft",
    "outcome_flywheel.models.train.memory",
    "outcome_flywheel.models.sampling",
    "outcome_flywheel.models.segments",
    "outcome_flywheel.models.loader",
]
# Per mirrored file, what both frameworks define with the same parameters.
MIRRORED = {
    "losses.py": ["gspo_loss", "weighted_dpo_loss"],
    "recompute.py": ["decoder_layers", "recomputing"],
    "training.py": ["adamw", "train", "inference", "to_numpy", "as_array", "seed"],
    "sampling.py": ["filter_logits", "sample_batch"],
    "logprobs.py": [
        "chunk_rows",
        "selective_log_softmax",
        "token_logprobs",
        "token_kl",
        "plain_token_logprobs",
        "plain_token_kl",
        "CHUNK_ELEMENTS",
    ],
}
# CUDA engines of the torch backend only, with no mlx mirror: vLLM, and the static-cache sampler
# captured in CUDA graphs (MLX keeps its own sampler); the shared prompt's read-only cache (MLX runs
# every row's prompt, `runs_shared_prefix`).
TORCH_ONLY = {
    "vllm_sampling.py",
    "graph_sampler.py",
    "static_cache.py",
    "fused_decode.py",
    "precision.py",
    "prefix_cache.py",
    "followers.py",  # a data-parallel step's other ranks: mlx trains in one process
}
# MLX's adapter format and PEFT's, converted both ways (torch reads PEFT's directly).
MLX_ONLY = {"lora_convert.py"}


def test_configs_and_shared_trainers_import_neither_torch_nor_mlx():
    code = f"import sys, importlib\nfor m in {LIGHT!r}: importlib.import_module(m)\nprint(sorted({{'torch', 'mlx'}} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=MODELS.parents[1]
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_every_mirror_file_exists_on_both_sides():
    torch_files = {p.name for p in (MODELS / "torch").glob("*.py")}
    mlx_files = {p.name for p in (MODELS / "mlx").glob("*.py")}
    assert torch_files - TORCH_ONLY == mlx_files - MLX_ONLY == {"__init__.py", "backend.py", *MIRRORED}


def _signatures(path: Path) -> dict[str, list[str]]:
    tree = ast.parse(path.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = [a.arg for a in node.args.args + node.args.kwonlyargs]
        elif isinstance(node, ast.Assign):
            out.update({t.id: [] for t in node.targets if isinstance(t, ast.Name)})
    return out


@pytest.mark.parametrize("name", sorted(MIRRORED))
def test_mirror_files_define_the_same_functions(name):
    torch_defs, mlx_defs = _signatures(MODELS / "torch" / name), _signatures(MODELS / "mlx" / name)
    for fn in MIRRORED[name]:
        assert fn in torch_defs and fn in mlx_defs, fn
        assert torch_defs[fn] == mlx_defs[fn], fn
    if name == "training.py":
        assert "FRAMEWORK" in torch_defs and "FRAMEWORK" in mlx_defs


def test_both_backends_lend_their_framework_and_log_prob_functions():
    for name in ("torch", "mlx"):
        tree = ast.parse((MODELS / name / "backend.py").read_text())
        [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
        assert {"batch_logprobs_hidden", "sequence_logps", "use_master_weights", "add_lora", "save"} <= methods, name
        assert not {"train_gspo", "train_weighted_dpo"} & methods, name  # written once, in interface.ModelBackend
        assert any(isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "framework" for n in cls.body), (
            name
        )


def test_no_models_file_is_over_450_lines():
    for path in MODELS.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 450, path


@pytest.mark.parametrize("cls", [GSPOConfig, WeightedDPOConfig, GSPOExample, PreferencePair])
def test_every_config_field_has_help(cls):
    for f in fields(cls):
        assert f.metadata.get("help"), f"{cls.__name__}.{f.name}"
    if cls in (GSPOConfig, WeightedDPOConfig):
        assert all(f.default is not MISSING or f.default_factory is not MISSING for f in fields(cls))


def test_config_defaults_and_validation():
    g = GSPOConfig()
    assert (
        g.objective,
        g.learning_rate,
        g.epsilon_low,
        g.epsilon_high,
        g.batch_size,
        g.epochs,
        g.max_grad_norm,
        g.seed,
        g.temperature,
        g.share_prompt_prefix,
        g.one_at_a_time,
        g.old_logprobs,
        (g.kl_beta, g.kl_span, g.kl_estimator),
    ) == ("token", 2e-3, None, None, 16, 4, 1.0, 0, 1.0, True, False, "recompute", (0.1, "ticker", "exact"))
    assert g.clip_band() == (0.2, 0.28) and (g.sequence_epsilon_low, g.sequence_epsilon_high) == (3e-4, 4e-4)
    assert g.lora is not None and g.lora.r == 8
    for bad in ({"objective": "ppo"}, {"old_logprobs": "cached"}, {"temperature": 0.0}, {"kl_span": "note"}):
        with pytest.raises(ValueError):
            GSPOConfig(**bad)
    d = WeightedDPOConfig()
    assert (
        d.beta,
        d.learning_rate,
        d.batch_size,
        d.epochs,
        d.lora.r,
        d.lora.alpha,
        d.max_grad_norm,
        d.completion_unit,
        d.seed,
    ) == (0.02, 1e-3, 8, 8, 8, 16, 1.0, "line", 0)


# -- the shared batching plan ---------------------------------------------------------------------
def _previous_dpo_batches(n, batch_size, epochs, seed):
    """The weighted-DPO trainers' order before they were shared (torch's and mlx's `_batches`)."""
    rng = random.Random(seed)
    for _ in range(epochs):
        order = list(range(n))
        rng.shuffle(order)
        for start in range(0, n, batch_size):
            yield order[start : start + batch_size]


@pytest.mark.parametrize("n, batch_size, epochs, seed", [(10, 3, 2, 0), (7, 8, 3, 5), (32, 8, 8, 11)])
def test_pair_plan_is_the_trainers_previous_order(n, batch_size, epochs, seed):
    plan = batch_plan(range(n), batch_size, epochs, seed, group_by_prompt=False)
    assert plan == list(_previous_dpo_batches(n, batch_size, epochs, seed))
    # distinct keys grouped give the same plan
    assert plan == batch_plan(list(range(n)), batch_size, epochs, seed, group_by_prompt=True)


def test_prompt_groups_stay_together_and_every_epoch_covers_every_item():
    keys = ["a", "a", "b", "c", "c", "c", "b", "d"]
    plan = batch_plan(keys, 3, 2, seed=4)
    flat = [i for batch in plan for i in batch]
    assert sorted(flat) == sorted(list(range(len(keys))) * 2)
    for epoch in (flat[: len(keys)], flat[len(keys) :]):
        seen = [keys[i] for i in epoch]
        for key in set(keys):  # a group's items are contiguous in the epoch's order
            pos = [j for j, k in enumerate(seen) if k == key]
            assert pos == list(range(pos[0], pos[0] + len(pos))), (key, seen)
    assert plan != batch_plan(keys, 3, 2, seed=5)
