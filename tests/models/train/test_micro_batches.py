"""Training within a memory budget (`models/train/memory.py`): a minibatch taken in micro-batches whose
scaled gradients add up (gradient accumulation) is the same update as the minibatch whole, for GSPO
(the token objective with its whole-note part), weighted DPO and SFT, in torch and mlx: the same loss
and the same gradient, within what fp32 rounding allows between two batch shapes of one forward.

The bounds (tests/tolerances.py): the loss is a function of the response tokens' log-probs; with
c_t its sensitivity to token t's log-prob at the first step (ratios 1, nothing clipped, the IS
weight at most its cap), |loss_a - loss_b| <= sum_t c_t tol_t with tol_t the per-token log-prob
bound of two fp32 evaluations, and ||grad_a - grad_b|| <= sum_t c_t gradient_bound scale_t. A
wrong scale on a part (say n_part / n forgotten) moves the loss by a factor, far outside them."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from outcome_flywheel.models.interface import LoraSettings, TrainStats
from outcome_flywheel.models.loader import load_backend
from outcome_flywheel.models.segments import encode_segments, flatten_segments
from outcome_flywheel.models.train.dpo import train_weighted_dpo
from outcome_flywheel.models.train.dpo_config import PreferencePair, WeightedDPOConfig
from outcome_flywheel.models.train.gspo import train_gspo
from outcome_flywheel.models.train.gspo_config import GSPOConfig, GSPOExample
from outcome_flywheel.models.train.memory import (
    MEMORY_VARIABLE,
    RECOMPUTE_VARIABLE,
    bytes_per_token,
    forward_costs,
    forward_tokens,
    head_bytes,
    mask_share,
    memory_plan,
    split_by_cost,
    token_limit,
    training_state_bytes,
)
from outcome_flywheel.models.train.sft import encode_sft, train_sft
from outcome_flywheel.models.train.sft_config import SFTConfig, SFTExample
from tests.mlx_fixtures import PROMPTS, RESPONSES
from tests.tolerances import gradient_bound, logprob_gradient_scales, logprob_tolerances, longest

ONE_SEQUENCE = "1e-6"  # GiB: below one token's activations, so every part holds one sequence
ADVANTAGES = [1.3, -0.4, 0.6, -1.1, 0.9, -1.3]


def gspo_case(backend):
    prompts = [PROMPTS[i % 3] for i in range(6)]
    responses = [backend.encode_response(RESPONSES[i % 3] + " and more" * i) for i in range(6)]
    behaviour = backend.response_logprobs(prompts, responses)
    examples = [
        GSPOExample(p, r, [float(x) for x in b], a, token_advantages=[0.5 * a] * len(r))
        for p, r, b, a in zip(prompts, responses, behaviour, ADVANTAGES)
    ]
    config = GSPOConfig(batch_size=6, epochs=1, temperature=1.0)
    # sensitivity of the loss to each token's log-prob: the token part A_t / (B x longest) and the
    # whole-note part N_i / (B x len_i) (GSPO's sequence ratio), both times the IS weight's cap
    b, top = len(examples), max(len(r) for r in responses)
    weights = [
        config.tis_cap * (np.abs(e.token_advantages) / (b * top) + abs(e.advantage) / (b * len(e.response_ids)))
        for e in examples
    ]
    return prompts, responses, weights, lambda be: train_gspo(be, examples, config)


def dpo_case(backend):
    pairs = [
        PreferencePair(PROMPTS[i % 3], RESPONSES[i % 3], RESPONSES[(i + 1) % 3] + " now" * i, w)
        for i, w in enumerate([1.0, 3.0, 0.3, 1.5])
    ]
    config = WeightedDPOConfig(epochs=1, batch_size=4, reference_batch_size=2)  # two reference passes
    mean_weight = np.mean([p.weight for p in pairs])
    prompts, responses, weights = [], [], []
    for p in pairs:  # each line of chosen and rejected is a response to the prompt (segments.py)
        for text in (p.chosen, p.rejected):
            rows, segments, _ = flatten_segments(
                [p.prompt], [encode_segments(backend.encode_response, text, config.completion_unit)]
            )
            prompts += rows
            responses += segments
            # d loss / d log-prob of a token of the pair: beta w sigma(.) / (B x mean weight) <= beta w / (B x mean weight)
            weights += [np.full(len(s), config.beta * p.weight / (len(pairs) * mean_weight)) for s in segments]
    return prompts, responses, weights, lambda be: train_weighted_dpo(be, pairs, config)


def sft_case(backend):
    examples = [SFTExample(PROMPTS[i % 3], RESPONSES[i % 3] + " again" * i) for i in range(5)]
    config = SFTConfig(epochs=1, batch_size=5)
    contexts, completions = encode_sft(backend, examples, config.max_completion_tokens)
    total = sum(len(c) for c in completions)  # the mean over the minibatch's completion tokens
    return (
        contexts,
        completions,
        [np.full(len(c), 1.0 / total) for c in completions],
        lambda be: train_sft(be, examples, config),
    )


CASES = {"gspo": gspo_case, "dpo": dpo_case, "sft": sft_case}


BOUNDS: dict[str, tuple[float, float]] = {}  # per trainer, from the torch test (the mlx one reuses them)


def bounds(backend, prompts, responses, weights) -> tuple[float, float]:
    tolerances = logprob_tolerances(backend, prompts, responses)
    per_token, _ = logprob_gradient_scales(backend, prompts, responses)
    rel = gradient_bound(backend, longest(backend, prompts, responses))
    loss = sum(float(np.sum(w * t)) for w, t in zip(weights, tolerances))
    grad = sum(float(np.sum(w * rel * s)) for w, s in zip(weights, per_token))
    return loss, grad


def torch_step(tiny_model_dir, make, monkeypatch, memory: str | None):
    if memory is None:
        monkeypatch.delenv(MEMORY_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(MEMORY_VARIABLE, memory)
    backend = load_backend("torch", tiny_model_dir, device="cpu")
    prompts, responses, weights, train = make(backend)
    backend.framework.seed(1)  # the LoRA init (GSPO's caller seeds it; DPO and SFT seed their own)
    stats = train(backend)
    grads = {n: p.grad.detach().clone() for n, p in backend.model.named_parameters() if p.grad is not None}
    return backend, stats, grads, (prompts, responses, weights)


def test_stats_without_a_memory_plan_count_one_part_a_step():
    """What the daily row and the adapter's metadata read of a trainer that records no plan (a test
    double, an older trainer): each step whole, nothing recomputed."""
    stats = TrainStats()
    stats.record(1.0, 0.5, {})
    stats.record(0.5, 0.25, {})
    assert stats.micro_batches == 2 and stats.layers_recomputed is False
    stats.extra.update(micro_batches=5, recompute=True)
    assert stats.micro_batches == 5 and stats.layers_recomputed is True


@pytest.mark.parametrize("trainer", sorted(CASES))
def test_micro_batches_give_the_minibatch_update_in_torch(tiny_model_dir, monkeypatch, trainer):
    _, whole, g_whole, _ = torch_step(tiny_model_dir, CASES[trainer], monkeypatch, None)
    backend, parts, g_parts, case = torch_step(tiny_model_dir, CASES[trainer], monkeypatch, ONE_SEQUENCE)
    # the trainer records its plan (read from `extra`: the properties' fallback would hide a missing one)
    assert whole.steps == parts.steps == 1 and whole.extra["micro_batches"] == 1
    assert parts.extra["micro_batches"] == {"gspo": 6, "dpo": 4, "sft": 5}[trainer]  # one sequence (or pair) a part
    assert whole.extra["recompute"] is False and parts.extra["recompute"] is False  # parts, not recomputation, here
    monkeypatch.delenv(MEMORY_VARIABLE)
    loss_bound, grad_bound = BOUNDS[trainer] = bounds(backend, *case)
    assert abs(parts.losses[0] - whole.losses[0]) <= loss_bound, (parts.losses, whole.losses, loss_bound)
    # the gradients before the step (clipped alike: the same norm), parameter by parameter
    difference = np.sqrt(sum(float(((g_parts[k] - g_whole[k]).double() ** 2).sum()) for k in g_whole))
    assert set(g_parts) == set(g_whole) and difference <= grad_bound, (difference, grad_bound)
    assert abs(parts.grad_norms[0] - whole.grad_norms[0]) <= grad_bound
    # and the bound is tight enough to see a part scaled wrongly (a part counted twice moves the loss
    # by a share of it); GSPO's first loss is ~0 (its advantages sum to ~0), its gradient says it
    assert abs(whole.losses[0]) / 6 > loss_bound or trainer == "gspo"
    assert whole.grad_norms[0] / 6 > grad_bound


@contextlib.contextmanager
def counted_calls(cls: type, method: str):
    """Within: every call of `cls.method` is counted in the yielded list (one item a call)."""
    calls: list[int] = []
    original = getattr(cls, method)

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    setattr(cls, method, counted)
    try:
        yield calls
    finally:
        setattr(cls, method, original)


@pytest.mark.parametrize("trainer", sorted(CASES))
def test_recomputed_layers_give_the_minibatch_update_in_torch(tiny_model_dir, monkeypatch, trainer):
    """`FLYWHEEL_TRAIN_RECOMPUTE=always` (`torch/recompute.py`): the whole minibatch, each decoder
    layer's activations recomputed in the backward pass, gives the loss and gradients of keeping
    them (fp32, within the bounds above); and it did recompute: the layers ran more forwards, a
    whole number of passes over every layer more."""
    from outcome_flywheel.models.torch.recompute import decoder_layers

    monkeypatch.delenv(MEMORY_VARIABLE, raising=False)
    runs = {}
    for setting in ("never", "always"):
        monkeypatch.setenv(RECOMPUTE_VARIABLE, setting)
        backend = load_backend("torch", tiny_model_dir, device="cpu")
        layers = decoder_layers(backend.model)
        with counted_calls(type(layers[0]), "forward") as calls:
            prompts, responses, weights, train = CASES[trainer](backend)
            backend.framework.seed(1)
            stats = train(backend)
        grads = {n: p.grad.detach().clone() for n, p in backend.model.named_parameters() if p.grad is not None}
        runs[setting] = stats, grads, len(calls)
    (kept, g_kept, calls_kept), (recomputed, g_recomputed, calls_recomputed) = runs["never"], runs["always"]
    assert kept.extra["recompute"] is False and recomputed.extra["recompute"] is True
    assert kept.extra["micro_batches"] == recomputed.extra["micro_batches"] == 1
    extra = calls_recomputed - calls_kept
    assert extra > 0 and extra % len(layers) == 0, (calls_kept, calls_recomputed, len(layers))
    loss_bound, grad_bound = bounds(backend, prompts, responses, weights)
    assert abs(recomputed.losses[0] - kept.losses[0]) <= loss_bound, (recomputed.losses, kept.losses)
    difference = np.sqrt(sum(float(((g_recomputed[k] - g_kept[k]).double() ** 2).sum()) for k in g_kept))
    assert set(g_recomputed) == set(g_kept) and difference <= grad_bound, (difference, grad_bound)
    print(f"{trainer}: {calls_kept} layer forwards kept, {calls_recomputed} recomputed; gradient gap {difference:.2e}")


@pytest.mark.parametrize("trainer", sorted(CASES))
def test_recomputed_layers_give_the_minibatch_update_in_mlx(tiny_model_dir, monkeypatch, trainer):
    """The same in MLX (`mlx/recompute.py`, `mlx.nn.utils.checkpoint` on each decoder layer): the loss
    and gradient norm of keeping the activations, within the torch model's bounds, and more layer calls."""
    pytest.importorskip("mlx.core")
    from outcome_flywheel.models.mlx.recompute import decoder_layers

    if trainer not in BOUNDS:  # run alone: the same bounds, from the torch model
        reference = load_backend("torch", tiny_model_dir, device="cpu")
        BOUNDS[trainer] = bounds(reference, *CASES[trainer](reference)[:3])
    loss_bound, grad_bound = BOUNDS[trainer]
    monkeypatch.delenv(MEMORY_VARIABLE, raising=False)
    runs = {}
    for setting in ("never", "always"):
        monkeypatch.setenv(RECOMPUTE_VARIABLE, setting)
        backend = load_backend("mlx", tiny_model_dir)
        with counted_calls(type(decoder_layers(backend.model)[0]), "__call__") as calls:
            train = CASES[trainer](backend)[3]
            backend.framework.seed(1)
            stats = train(backend)
        runs[setting] = stats, len(calls)
    (kept, calls_kept), (recomputed, calls_recomputed) = runs["never"], runs["always"]
    assert kept.extra["recompute"] is False and recomputed.extra["recompute"] is True
    assert kept.extra["micro_batches"] == recomputed.extra["micro_batches"] == 1
    assert calls_recomputed > calls_kept, (calls_kept, calls_recomputed)
    assert abs(recomputed.losses[0] - kept.losses[0]) <= loss_bound
    assert abs(recomputed.grad_norms[0] - kept.grad_norms[0]) <= grad_bound
    print(f"{trainer} (mlx): {calls_kept} layer calls kept, {calls_recomputed} recomputed")


@pytest.mark.parametrize("trainer", sorted(CASES))
def test_micro_batches_give_the_minibatch_update_in_mlx(tiny_model_dir, monkeypatch, trainer):
    pytest.importorskip("mlx.core")
    if trainer not in BOUNDS:  # run alone: the same bounds, from the torch model
        reference = load_backend("torch", tiny_model_dir, device="cpu")
        BOUNDS[trainer] = bounds(reference, *CASES[trainer](reference)[:3])
    loss_bound, grad_bound = BOUNDS[trainer]
    results = {}
    for memory in (None, ONE_SEQUENCE):
        if memory is None:
            monkeypatch.delenv(MEMORY_VARIABLE, raising=False)
        else:
            monkeypatch.setenv(MEMORY_VARIABLE, memory)
        backend = load_backend("mlx", tiny_model_dir)
        train = CASES[trainer](backend)[3]
        backend.framework.seed(1)
        results[memory] = train(backend)
    whole, parts = results[None], results[ONE_SEQUENCE]
    assert whole.extra["micro_batches"] == 1 and parts.extra["micro_batches"] > 1
    assert abs(parts.losses[0] - whole.losses[0]) <= loss_bound
    assert abs(parts.grad_norms[0] - whole.grad_norms[0]) <= grad_bound


def split_by_tokens(items, lengths, limit):
    """Items cut by their padded size, count x longest (`memory.forward_tokens` without a shared prompt)."""
    sizes = dict(zip(range(len(items)), lengths))
    parts = split_by_cost(list(range(len(items))), lambda part: len(part) * max(sizes[i] for i in part), limit)
    return [[items[i] for i in part] for part in parts]


def test_the_budget_splits_by_padded_tokens_and_says_what_it_is(tiny_model_dir, monkeypatch, caplog):
    assert split_by_tokens([1, 2, 3, 4], [10, 10, 30, 5], None) == [[1, 2, 3, 4]]
    assert split_by_tokens([1, 2, 3, 4], [10, 10, 30, 5], 60) == [[1, 2], [3, 4]]  # 3 x 30 > 60, 2 x 30 fits
    assert split_by_tokens([1, 2, 3, 4], [10, 10, 30, 5], 50) == [[1, 2], [3], [4]]  # 2 x 30 > 50
    assert split_by_tokens([1, 2], [100, 100], 10) == [[1], [2]]  # a sequence over the limit goes alone
    assert split_by_tokens([7, 7, 7], [10, 20, 30], 40) == [[7, 7], [7]]  # equal items keep their own lengths
    # the fewest parts, as even as they can be: 5 + 5 rows, not 9 + 1
    assert split_by_tokens(list(range(10)), [10] * 10, 90) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    # even parts that would not fit keep the greedy cut: 3 x 30 > 60 for [10, 10, 30]
    assert split_by_tokens([1, 2, 3, 4], [10, 10, 30, 30], 60) == [[1, 2], [3, 4]]
    # a forward's padded tokens: rows of prompt + response at the longest row; or the prompt shared,
    # once per distinct prompt, each row its response and its share of the prompt's keys and values
    prompts, lengths = [[1, 2, 3], [1, 2, 3], [4, 5]], [10, 6, 8]
    assert forward_tokens(prompts, lengths, None) == 3 * 13
    assert forward_tokens(prompts, lengths, 0.25) == 2 * 3 + 3 * (10 + 0.25 * 3)
    # any growing cost: greedy needs 4 parts ([0, 1, 2], [3], [4], [5]); 2 + 2 + 1 + 1 fit too
    assert split_by_cost(list(range(6)), lambda part: sum(part) + 1, 6) == [[0, 1], [2, 3], [4], [5]]
    backend = load_backend("torch", tiny_model_dir, device="cpu")
    monkeypatch.delenv(MEMORY_VARIABLE, raising=False)
    assert token_limit(backend) is None  # the CPU: no budget unless one is set
    monkeypatch.setenv(MEMORY_VARIABLE, "4")  # past a whole chunk's tokens
    per_token = bytes_per_token(backend)
    # the step's gradients and AdamW moments come out of the budget first: every weight, then an
    # adapter's; then the head's chunk (float32 logits of 2**25 at most, three copies), then activations
    weights = sum(p.numel() * 4 for p in backend.model.parameters())
    vocab = backend.vocab_size
    chunk = 3 * 4 * (2**25 // vocab) * vocab
    assert head_bytes(backend) == chunk and head_bytes(backend, 10) == 3 * 4 * 10 * vocab
    assert training_state_bytes(backend) == 3 * weights
    assert token_limit(backend) == (4 * 2**30 - 3 * weights - chunk) // per_token
    backend.add_lora(LoraSettings(r=4, alpha=8))
    adapter = sum(p.numel() * 4 for name, p in backend.model.named_parameters() if "lora_" in name)
    assert training_state_bytes(backend) == 3 * adapter and 0 < adapter < weights / 10
    assert token_limit(backend) == (4 * 2**30 - 3 * adapter - chunk) // bytes_per_token(backend)
    # below a whole chunk the head costs per token: a budget of 10 tokens' activations and head
    ten = 3 * adapter + 10 * (bytes_per_token(backend) + 4 * 4 * vocab)
    monkeypatch.setenv(MEMORY_VARIABLE, repr(ten / 2**30))
    assert token_limit(backend) == 10
    # a setting that leaves nothing for activations: one sequence at a time, and a warning that says why
    monkeypatch.setenv(MEMORY_VARIABLE, "1e-6")
    with caplog.at_level("WARNING", logger="outcome_flywheel.models.train.memory"):
        assert token_limit(backend) == 1
    assert "leaves nothing for activations" in caplog.text and "AdamW" in caplog.text
    # full fine-tuning over float32 master weights under bf16 autocast: autocast's bf16 copy of each too
    from outcome_flywheel.models.torch.backend import TorchBackend

    master = TorchBackend(tiny_model_dir, device="cpu", dtype="bfloat16", master_weights=True)
    master.use_master_weights()
    count = sum(p.numel() for p in master.model.parameters())
    assert training_state_bytes(master) == 3 * 4 * count + 2 * count
    for bad in ("0", "-1", "lots", "inf"):
        monkeypatch.setenv(MEMORY_VARIABLE, bad)
        with pytest.raises(ValueError, match=MEMORY_VARIABLE):
            token_limit(backend)


def _saved_bytes(backend, prompts, responses) -> int:
    """Bytes of the activations autograd saves in one training forward (parameters left out)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in backend.model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        backend.batch_logprobs(prompts, responses, 1.0)
    return sum(saved.values())


@pytest.mark.parametrize("dtype,lora", [("bfloat16", True), ("bfloat16", False), ("float32", True)])
def test_a_tokens_estimated_cost_is_what_autograd_saves_per_layer(tmp_path, dtype, lora):
    """The budget's count per token and layer (memory.py) against the tensors autograd really
    saves, on Qwen3 blocks with LoRA (PEFT's float32 adapter under bf16, and in fp32) and with every
    weight training: one layer's share, the two-layer model less the one-layer one, for 4 rows padded
    to 96 tokens (one response shorter: a padding mask, as training batches have, under which
    transformers repeats the keys and values for the query heads, and SDPA keeps an additive copy of
    the mask a layer: `memory.mask_share`). Left out of the count: the per-row scalars (the norms'
    scales, attention's log-sum-exp), 4(2 + 2 heads + kv heads) bytes per token and layer."""
    import torch

    from outcome_flywheel.models.provision import qwen3_shapes
    from outcome_flywheel.models.torch.backend import TorchBackend

    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 400, 32).tolist()] * 4
    responses = [rng.integers(10, 400, n).tolist() for n in (64, 64, 64, 40)]
    counted, estimated, weight_copies = {}, {}, {}
    for layers in (1, 2):
        shape = dict(
            qwen3_shapes.SHAPES["qwen3-tiny"], num_hidden_layers=layers, hidden_size=128, intermediate_size=384
        )
        monkeypatch_shapes = {**qwen3_shapes.SHAPES, "probe": shape}
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(qwen3_shapes, "SHAPES", monkeypatch_shapes)
            model_dir = qwen3_shapes.build_model(tmp_path / f"m{layers}", "probe", dtype=dtype)
        backend = TorchBackend(model_dir, device="cpu", dtype=dtype)
        if lora:
            backend.add_lora(LoraSettings(r=8, alpha=16))
        backend.prepare_for_training(keep_moments=False)
        torch.manual_seed(0)
        counted[layers] = _saved_bytes(backend, prompts, responses)
        # the forward's activations by the count: its padded tokens and its masks' elements
        lengths = [len(r) for r in responses]
        estimated[layers] = bytes_per_token(backend) * forward_tokens(prompts, lengths, None, mask_share(backend))
        # autocast's compute-dtype copy of a float32 adapter's weights: a layer's, whatever the tokens
        weight_copies[layers] = training_state_bytes(backend) - 3 * backend.framework.trainable_bytes(backend)
    tokens = len(prompts) * max(len(p) + len(r) for p, r in zip(prompts, responses))  # padded
    per_layer = (counted[2] - counted[1] - (weight_copies[2] - weight_copies[1])) / tokens
    estimate = (estimated[2] - estimated[1]) / tokens
    config = shape
    scalars = 4 * (2 + 2 * config["num_attention_heads"] + config["num_key_value_heads"])
    assert estimate <= per_layer <= estimate + scalars, (per_layer, estimate)


def test_the_plan_recomputes_when_that_takes_fewer_parts(tiny_model_dir, monkeypatch):
    """`memory.memory_plan`: `auto` recomputes the layers only where the budget binds and recomputing
    takes the minibatches in fewer parts; `never` and `always` as they say; a bad setting, or
    `always` on a backend that cannot recompute, is a ValueError that names the variable."""
    backend = load_backend("torch", tiny_model_dir, device="cpu")
    rows = [([1] * 20, 60)] * 8
    minibatches = [rows]

    def cost_of(costs):
        return lambda part: forward_tokens([p for p, _ in part], [r for _, r in part], *costs)

    monkeypatch.delenv(MEMORY_VARIABLE, raising=False)
    monkeypatch.delenv(RECOMPUTE_VARIABLE, raising=False)
    assert memory_plan(backend, minibatches, cost_of, shared=True) == (None, forward_costs(backend, True), False)
    plain, recomputed = bytes_per_token(backend), bytes_per_token(backend, recompute=True)
    assert recomputed < plain
    head = head_bytes(backend, 1)  # a token's share of the head below a whole chunk
    # whole either way (the masks take a few tokens more); about 3 parts kept, fewer recomputed
    for tokens, expected in ((8 * 88, False), (8 * 80 // 3, True)):
        setting = training_state_bytes(backend) + (head + plain) * tokens
        monkeypatch.setenv(MEMORY_VARIABLE, repr(setting / 2**30))
        assert token_limit(backend) == tokens
        plan = memory_plan(backend, minibatches, cost_of, shared=False)
        assert plan.recompute is expected, (tokens, plan)
        assert plan.limit == token_limit(backend, recompute=expected)
        monkeypatch.setenv(RECOMPUTE_VARIABLE, "never")
        assert memory_plan(backend, minibatches, cost_of, shared=False).recompute is False
        monkeypatch.setenv(RECOMPUTE_VARIABLE, "always")
        assert memory_plan(backend, minibatches, cost_of, shared=False).recompute is True
        monkeypatch.delenv(RECOMPUTE_VARIABLE)
    monkeypatch.setenv(RECOMPUTE_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match=f"{RECOMPUTE_VARIABLE}='sometimes'"):
        memory_plan(backend, minibatches, cost_of, shared=False)
    monkeypatch.setenv(RECOMPUTE_VARIABLE, "always")
    backend.recomputes_layers = False  # a backend without recomputation (both of the project's have it)
    with pytest.raises(ValueError, match="does not recompute"):
        memory_plan(backend, minibatches, cost_of, shared=False)
    with pytest.raises(ValueError, match="does not recompute"):
        super(type(backend), backend).recomputing(True)
