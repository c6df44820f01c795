"""AdamW's moments kept across days with the checkpoint (`models/train/optimizer_state.py`,
`Framework.optimizer_state` / `load_optimizer_state`, `ModelBackend.optimizer_tensors`): a run
resumed from a saved checkpoint equals the uninterrupted one bit for bit (torch, mlx; LoRA and full
weights), the state survives save -> load byte for byte (in either framework), a state that does
not fit the parameters is refused, torch and mlx resume each other's state, and the measured reason
for it all: a fresh AdamW's first step moves every weight by the full learning rate."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from outcome_flywheel.models.interface import LoraSettings
from outcome_flywheel.models.torch.backend import TorchBackend
from tests.mlx_fixtures import PROMPTS, RESPONSES, SMALL_LORA, mlx_adapter_dir, perturb_torch_lora
from tests.tolerances import gamma

LR = 2e-3  # GSPOConfig's default learning rate (LoRA on tiny-local)
ADVANTAGES = (1.0, -0.5, 0.8)
SIGNS = (1.0, -1.0, 1.0, -0.7)  # k = 4 steps whose gradients change sign, as a day's advantages do
J = 2  # the "day" boundary: steps [0, J) then save, load and steps [J, 4)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def torch_adapter(tiny_model_dir, tmp_path_factory):
    """A torch LoRA adapter with random non-zero factors (B = 0 would leave A without gradient)."""
    backend = TorchBackend(tiny_model_dir, device="cpu")
    backend.framework.seed(0)  # the LoRA init, so the figures of the last test repeat
    backend.add_lora(SMALL_LORA)
    perturb_torch_lora(backend)
    out = tmp_path_factory.mktemp("torch") / "adapter"
    backend.save(out)
    return out


@pytest.fixture(scope="module")
def mlx_adapter(tiny_model_dir, tmp_path_factory):
    mx = pytest.importorskip("mlx.core")
    mx.random.seed(0)
    return mlx_adapter_dir(tiny_model_dir, tmp_path_factory.mktemp("mlx") / "adapter", seed=5)


def batches(backend, signs=SIGNS, scale=1.0):
    prompts = [backend.prompt_ids(p) for p in PROMPTS]
    responses = [backend.encode_response(r) for r in RESPONSES]
    return [(prompts, responses, np.array(ADVANTAGES, dtype=np.float32) * s * scale) for s in signs]


def weighted_loss(backend):
    """-mean_i A_i * mean_t log pi (GSPO's reward-weighted objective at ratio 1), either framework."""
    fw = backend.framework

    def loss(model, batch):
        prompts, responses, advantages = batch
        logp, mask = backend.batch_logprobs(prompts, responses)
        per_sequence = (logp * mask).sum(-1) / mask.sum(-1)
        return -(fw.as_array(backend, advantages) * per_sequence).mean(), {}

    return loss


def train(backend, optimizer, steps):
    backend.framework.train(
        backend.model, optimizer, loss=weighted_loss(backend), iterate_batches=steps, max_grad_norm=1.0
    )


def trainable(backend) -> dict[str, np.ndarray]:
    """The trainable weights as NumPy arrays, by name."""
    if backend.name == "torch":
        return {n: p.detach().numpy().copy() for n, p in backend.model.named_parameters() if p.requires_grad}
    from mlx.utils import tree_flatten

    return {n: np.array(v) for n, v in tree_flatten(backend.model.trainable_parameters())}


def load(framework: str, tiny_model_dir, kind: str, adapter=None, folder=None):
    """The policy a day starts from: tiny-local with `adapter` (kind "lora") or every weight
    trainable ("full"); `folder`: a checkpoint saved by `backend.save`, loaded as the daily loop does."""
    if framework == "torch":
        if kind == "lora":
            return TorchBackend(tiny_model_dir, adapter_path=folder or adapter, device="cpu")
        return TorchBackend(folder or tiny_model_dir, device="cpu", master_weights=True)
    from outcome_flywheel.models.mlx.backend import MLXBackend

    return (
        MLXBackend(tiny_model_dir, adapter_path=folder or adapter)
        if kind == "lora"
        else MLXBackend(folder or tiny_model_dir)
    )


# -- (a), (b): a resumed run equals the uninterrupted one --------------------------------------------
@pytest.mark.parametrize("kind", ["lora", "full"])
@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_resumed_adamw_equals_the_uninterrupted_run(framework, kind, tiny_model_dir, torch_adapter, request, tmp_path):
    if framework == "mlx":
        pytest.importorskip("mlx.core")
    adapter = request.getfixturevalue("mlx_adapter") if framework == "mlx" else torch_adapter
    one = load(framework, tiny_model_dir, kind, adapter)
    fw = one.framework
    optimizer = fw.adamw(one.model, LR)
    train(one, optimizer, batches(one))  # k = 4 steps, one optimiser

    day1 = load(framework, tiny_model_dir, kind, adapter)
    first = fw.adamw(day1.model, LR)
    train(day1, first, batches(day1)[:J])
    day1.optimizer_tensors = fw.optimizer_state(first, day1.model)
    day1.save(tmp_path / "checkpoint")
    assert (tmp_path / "checkpoint" / day1.OPTIMIZER_STATE_FILE).exists()

    day2 = load(framework, tiny_model_dir, kind, adapter, folder=tmp_path / "checkpoint")  # a fresh load
    assert int(day2.optimizer_tensors["step"]) == J
    second = fw.adamw(day2.model, LR)
    fw.load_optimizer_state(second, day2.model, day2.optimizer_tensors)
    train(day2, second, batches(day2)[J:])

    # Exact equality, not a tolerance: the restored moments are a byte copy of the fp32 ones
    # (fp32 -> safetensors -> fp32 is lossless), `step` is an integer, the weights reload byte for
    # byte, and steps J..k then run the same kernels on the same inputs in the same order (one CPU
    # thread), so every rounding repeats. A tolerance would hide a lost or off-by-one step count,
    # which changes that step's bias correction 1 - 0.9^t by 10-30% at these t.
    expected, resumed = trainable(one), trainable(day2)
    assert expected.keys() == resumed.keys()
    differ = [n for n in expected if not np.array_equal(expected[n], resumed[n])]
    assert not differ, f"{len(differ)} of {len(expected)} weights differ, e.g. {differ[:3]}"
    state_one, state_two = fw.optimizer_state(optimizer, one.model), fw.optimizer_state(second, day2.model)
    assert int(state_one["step"]) == int(state_two["step"]) == len(SIGNS)
    assert all(np.array_equal(state_one[k], state_two[k]) for k in state_one)


# -- (c): save -> load keeps the state byte for byte ------------------------------------------------
def test_save_load_round_trip_keeps_optimizer_tensors_byte_identical(tiny_model_dir, torch_adapter, tmp_path):
    policy = load("torch", tiny_model_dir, "lora", torch_adapter)
    optimizer = policy.framework.adamw(policy.model, LR)
    train(policy, optimizer, batches(policy)[:1])
    state = policy.framework.optimizer_state(optimizer, policy.model)
    assert int(state["step"]) == 1 and state["step"].dtype == np.int64
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight.exp_avg" in state  # the adapter file's key
    policy.optimizer_tensors = state
    policy.save(tmp_path / "a")
    loaded = load("torch", tiny_model_dir, "lora", folder=tmp_path / "a").optimizer_tensors
    assert_byte_identical(state, loaded)

    again = load("torch", tiny_model_dir, "lora", folder=tmp_path / "a")
    again.save(tmp_path / "b")  # loaded, not trained: saved as it came
    assert_byte_identical(state, load("torch", tiny_model_dir, "lora", folder=tmp_path / "b").optimizer_tensors)

    plain = load("torch", tiny_model_dir, "lora", torch_adapter)
    assert plain.optimizer_tensors is None  # a checkpoint without the file loads as before
    plain.save(tmp_path / "b")  # no state: a stale file in the folder goes
    assert not (tmp_path / "b" / plain.OPTIMIZER_STATE_FILE).exists()


def test_mlx_save_load_round_trip_and_torch_reads_it(tiny_model_dir, torch_adapter, mlx_adapter, tmp_path):
    """An mlx checkpoint's state reloads byte for byte in mlx and in torch (PEFT names, PEFT shapes)."""
    policy = load("mlx", tiny_model_dir, "lora", mlx_adapter)
    optimizer = policy.framework.adamw(policy.model, LR)
    train(policy, optimizer, batches(policy)[:1])
    state = policy.framework.optimizer_state(optimizer, policy.model)
    policy.optimizer_tensors = state
    policy.save(tmp_path / "a")
    assert_byte_identical(state, load("mlx", tiny_model_dir, "lora", folder=tmp_path / "a").optimizer_tensors)
    assert load("mlx", tiny_model_dir, "lora", mlx_adapter).optimizer_tensors is None
    in_torch = load("torch", tiny_model_dir, "lora", folder=tmp_path / "a")
    assert_byte_identical(state, in_torch.optimizer_tensors)
    torch_optimizer = in_torch.framework.adamw(in_torch.model, LR)
    in_torch.framework.load_optimizer_state(torch_optimizer, in_torch.model, in_torch.optimizer_tensors)
    assert_byte_identical(state, in_torch.framework.optimizer_state(torch_optimizer, in_torch.model))


def assert_byte_identical(a: dict, b: dict | None) -> None:
    assert b is not None and a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert np.asarray(a[name]).tobytes() == np.asarray(b[name]).tobytes(), name


# -- (d): a state that does not fit is refused ------------------------------------------------------
@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_a_state_of_other_parameters_is_refused(framework, tiny_model_dir):
    if framework == "mlx":
        pytest.importorskip("mlx.core")

    def policy(lora: LoraSettings | None):
        backend = load(framework, tiny_model_dir, "full")
        if lora is not None:
            backend.add_lora(lora)
        return backend, backend.framework.adamw(backend.model, LR)

    saved_policy, saved_optimizer = policy(SMALL_LORA)
    fw = saved_policy.framework
    state = fw.optimizer_state(saved_optimizer, saved_policy.model)  # not stepped: zeros at step 0
    cases = {
        "another rank": (LoraSettings(r=8, alpha=16), "shapes differ"),
        "other target modules": (LoraSettings(r=4, alpha=8, target_modules=("q_proj", "v_proj")), "not trainable here"),
        "full weights": (None, "missing"),
    }
    for case, (lora, message) in cases.items():
        backend, optimizer = policy(lora)
        with pytest.raises(ValueError, match=message):
            fw.load_optimizer_state(optimizer, backend.model, state)
        fresh = fw.optimizer_state(optimizer, backend.model)
        assert int(fresh["step"]) == 0 and not any(v.any() for k, v in fresh.items() if k != "step"), case
    backend, optimizer = policy(SMALL_LORA)
    with pytest.raises(ValueError, match="step"):
        fw.load_optimizer_state(optimizer, backend.model, {k: v for k, v in state.items() if k != "step"})
    fw.load_optimizer_state(optimizer, backend.model, state)  # the same parameters: accepted


# -- torch and mlx resume each other -----------------------------------------------------------------
def test_torch_and_mlx_agree_on_a_restored_step_count():
    """Both frameworks' AdamW (mlx's with bias_correction=True) take step t + 1 from a state at t:
    3 steps in one framework with fixed gradients, the state moved to the other, the 4th step
    compared. Bound: each side rounds w + dw once (<= 1/2 ulp of |w| < 2, 1.2e-7 each) and computes
    dw in ~16 fp32 operations in its own order (relative <= 16 u ~ 1e-6 each); an off-by-one step
    count changes the 4th step's bias corrections by ~10%."""
    mx = pytest.importorskip("mlx.core")
    import mlx.nn as mnn

    from outcome_flywheel.models.mlx import training as mlx_training
    from outcome_flywheel.models.torch import training as torch_training

    rng = np.random.default_rng(0)
    weight = rng.normal(0, 0.5, (4, 6)).astype(np.float32)
    grads = [rng.normal(0, s, (4, 6)).astype(np.float32) for s in (1.0, 0.3, 2.0, 0.05)]

    def torch_linear(w):
        layer = torch.nn.Linear(6, 4, bias=False)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(w))
        return layer, torch_training.adamw(layer, LR)

    def torch_step(layer, optimizer, g):
        layer.weight.grad = torch.from_numpy(g.copy())
        optimizer.step()
        return layer.weight.detach().numpy().copy()

    def mlx_linear(w):
        layer = mnn.Linear(6, 4, bias=False)
        layer.weight = mx.array(w)
        return layer, mlx_training.adamw(layer, LR)

    def mlx_step(layer, optimizer, g):
        optimizer.update(layer, {"weight": mx.array(g)})
        mx.eval(layer.parameters(), optimizer.state)
        return np.array(layer.weight)

    for (make_a, step_a, state_a), (make_b, step_b, load_b) in [
        (
            (torch_linear, torch_step, torch_training.optimizer_state),
            (mlx_linear, mlx_step, mlx_training.load_optimizer_state),
        ),
        (
            (mlx_linear, mlx_step, mlx_training.optimizer_state),
            (torch_linear, torch_step, torch_training.load_optimizer_state),
        ),
    ]:
        layer_a, opt_a = make_a(weight)
        for g in grads[:3]:
            w3 = step_a(layer_a, opt_a, g)
        state = state_a(opt_a, layer_a)
        assert int(state["step"]) == 3 and set(state) == {"step", "weight.exp_avg", "weight.exp_avg_sq"}
        layer_b, opt_b = make_b(w3)
        load_b(opt_b, layer_b, state)
        update_a, update_b = step_a(layer_a, opt_a, grads[3]) - w3, step_b(layer_b, opt_b, grads[3]) - w3
        # the docstring's bound: atol 2 x 1/2 ulp of |w| < 2 (the w + dw roundings), rtol two sides
        # of ~16 fp32 operations on dw (moments, bias corrections, sqrt, eps, lr), 2 gamma(16)
        # (tests/tolerances.py: worst case 16 u at that size; was rtol=1e-5)
        np.testing.assert_allclose(update_b, update_a, rtol=2 * gamma(16), atol=2.5e-7)


def test_lora_state_names_are_the_same_in_torch_and_mlx(tiny_model_dir, torch_adapter, tmp_path):
    """A torch LoRA state loads into mlx (transposed into mlx's [in, r]) and reads back byte for byte."""
    pytest.importorskip("mlx.core")
    policy = load("torch", tiny_model_dir, "lora", torch_adapter)
    optimizer = policy.framework.adamw(policy.model, LR)
    train(policy, optimizer, batches(policy)[:J])
    policy.optimizer_tensors = policy.framework.optimizer_state(optimizer, policy.model)
    policy.save(tmp_path / "checkpoint")
    in_mlx = load("mlx", tiny_model_dir, "lora", folder=tmp_path / "checkpoint")
    mlx_optimizer = in_mlx.framework.adamw(in_mlx.model, LR)
    in_mlx.framework.load_optimizer_state(mlx_optimizer, in_mlx.model, in_mlx.optimizer_tensors)
    assert_byte_identical(policy.optimizer_tensors, in_mlx.framework.optimizer_state(mlx_optimizer, in_mlx.model))
    train(in_mlx, mlx_optimizer, batches(in_mlx)[J:])  # and it steps on from there
    assert int(in_mlx.framework.optimizer_state(mlx_optimizer, in_mlx.model)["step"]) == len(SIGNS)


# -- (e): why it matters ------------------------------------------------------------------------------
def test_a_fresh_adamw_moves_every_weight_by_lr_on_a_small_gradient_batch(tiny_model_dir, torch_adapter):
    """After a day of steps whose gradients change sign, a batch with 1% of the usual gradient:
    a fresh AdamW's first step is lr * g / |g| = lr * sign(g) on every weight; the restored one
    moves by m_hat / sqrt(v_hat) of lr, small since the history's signs cancel in m, not in v."""
    policy = load("torch", tiny_model_dir, "lora", torch_adapter)
    fw = policy.framework
    history = fw.adamw(policy.model, LR)
    train(policy, history, batches(policy, signs=(1.0, -1.0) * 3))
    state = fw.optimizer_state(history, policy.model)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    small = batches(policy, signs=(1.0,), scale=0.01)

    def first_step(restore: bool) -> tuple[float, float]:
        with torch.no_grad():
            for p, b in zip(params, before):
                p.copy_(b)
        optimizer = fw.adamw(policy.model, LR)
        if restore:
            fw.load_optimizer_state(optimizer, policy.model, state)
        train(policy, optimizer, small)
        moved = torch.cat([(p.detach() - b)[p.grad != 0].abs().flatten() for p, b in zip(params, before)]) / LR
        return float(moved.median()), float(moved.mean())

    fresh, restored = first_step(False), first_step(True)
    figures = (
        f"first step on a small-gradient batch, |dw| / lr over the weights with a gradient: "
        f"fresh AdamW median {fresh[0]:.3f} (mean {fresh[1]:.3f}), restored median {restored[0]:.3f} (mean {restored[1]:.3f})"
    )
    print(figures)
    assert 0.9 < fresh[0] <= 1.0 + 1e-3, figures  # lr * sign(g): every weight by about lr
    assert restored[0] < 0.25 * fresh[0], figures
