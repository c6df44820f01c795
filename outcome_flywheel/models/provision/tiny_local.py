"""`tiny-local`: a small Qwen3 model built on this machine from bundled text, no download.

1. A byte-level BPE tokenizer trained with `tokenizers` on the bundled notes.
2. A small Qwen3 config (hidden 128, 4 layers, tied embeddings).
3. A short causal-LM training on the bundled example trading notes (loss on the note only),
   so sampled output is note-like text that sometimes carries the six section headers and, like
   an instruct model's, mostly calls the headline's company, long or short whatever the news
   (`scripts/make_tiny_local_corpus.py`; `python -m benchmarks.tiny_local_calls` measures it); and on
   judge prompts built from the same notes (answer: one letter), so the frozen base can act as
   the daily loop's judge. Its judgement is weak (it prefers notes with more sections whose
   direction matches the next day's move), but it answers in the expected form.

Deterministic from the seed, in two senses (both in `build_info.json`):
- `recipe_sha256`: what the training consumed, on any machine: the config, the optimiser's settings,
  and every step's token ids, loss mask and learning rate. Integer and Python arithmetic only.
- `weights_sha256`: the weights, equal only under the same floating-point arithmetic. Another CPU
  (its SIMD kernels), another torch or MKL build, or one thread instead of several rounds the
  sums differently, and 440 steps carry a rounding into weights ~30% apart (relative L2), so
  the weights hash holds per machine (`arithmetic` records which), the recipe holds everywhere.
Saved as an ordinary Hugging Face model folder with a chat template, so both backends load it.

Shipped built: `bundled/tiny-local/` holds the build of the default config (the demo's and the
test suite's, FLYWHEEL_SEED=0), so a fresh clone copies ~4 MB instead of training 440 steps.
`ensure_tiny_local` uses it only when its recorded fingerprint is the config's and its weights and
files hash to the recorded values (`bundle.py`); otherwise it builds, and a log line says why.
The builder stays the source of truth:

    python -m outcome_flywheel.models.provision.tiny_local             # .cache/tiny-local-<fp>: bundle or build
    python -m outcome_flywheel.models.provision.tiny_local --rebuild   # build afresh, compare with the bundle
    python -m outcome_flywheel.models.provision.tiny_local --rebuild --refresh-bundle   # and ship that build

`--seed`, `--train-steps`, `--judge-examples` pick another config (`--refresh-bundle SLOT` ships it
in its own slot); in Dagster, the `base_model` asset's run config `rebuild: true` builds afresh.
Run `--rebuild --refresh-bundle` after changing the builder, the config's defaults or the corpus.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from outcome_flywheel.models.prompts import JUDGE_LETTERS, NOTE_SECTIONS, judge_messages, trading_note_messages
from outcome_flywheel.models.provision import bundle
from outcome_flywheel.models.provision.bundle import BUNDLED
from outcome_flywheel.models.provision.folder import (
    cache_dir,
    cache_lock,
    ensure_folder,
    read_build_info,
    save_model_folder,
    weights_sha256,
)
from outcome_flywheel.settings import SAMPLE_DATA

NAME = "tiny-local"
CORPUS = SAMPLE_DATA / "tiny_local" / "notes.jsonl"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as Qwen uses; `enable_thinking` and other template kwargs are accepted and ignored.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyLocalConfig:
    seed: int = 0
    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    # 385 note steps: fewer and the model does not yet copy the headline's company into its call
    # (300 steps at every 3rd a judge batch, 3e-3: 7% of notes on it; these: ~90%, build ~1.3x).
    train_steps: int = 440
    batch_size: int = 16
    judge_examples: int = 400
    judge_every: int = 8  # every n-th step is a batch of judge prompts (the long, costly ones)
    learning_rate: float = 5e-3
    warmup_steps: int = 20

    def fingerprint(self) -> str:
        payload = json.dumps(asdict(self), sort_keys=True) + _sha256_file(CORPUS)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


CLIP_NORM = 1.0


def arithmetic() -> dict:
    """What decides the rounding of a CPU build's sums, besides the code: torch (and the MKL in it), the
    SIMD kernels it picked on this CPU, and its thread count (1 and 2 differ). Recorded beside the
    weights hash: the same recipe gives the same weights only where this is the same."""
    import platform

    import torch

    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_corpus() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def _judge_examples(rows: list[dict], n: int, seed: int) -> list[tuple[list[dict], str]]:
    """Judge prompts over 2..8 corpus notes with the letter of the best one as the answer:
    most sections present, +3 when its Buy/Sell side matches the next day's move."""
    rng = random.Random(seed + 1)
    out = []
    for _ in range(n):
        subject = rng.choice(rows)
        rose = rng.random() < 0.5
        move = f"{subject['ticker']} shares {'rise' if rose else 'fall'} {rng.randint(1, 9)}% after the news"
        noise = [rng.choice(rows)["title"] for _ in range(rng.randint(0, 2))]
        k = rng.randint(2, len(JUDGE_LETTERS))
        candidates = [rng.choice(rows)["note"] for _ in range(k)]

        def score(note: str) -> int:
            sections = sum(f"{name}:" in note for name in NOTE_SECTIONS)
            side_up = "Buy " in note or "constructive" in note
            side_down = "Sell " in note or "cautious" in note
            return sections + 3 * ((rose and side_up) or (not rose and side_down))

        best = max(range(k), key=lambda i: (score(candidates[i]), -i))
        messages = judge_messages(subject["title"], [move, *noise], candidates)
        out.append((messages, JUDGE_LETTERS[best]))
    return out


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_local(out_dir: Path, config: TinyLocalConfig = TinyLocalConfig(), log=print) -> dict:
    """Build the model into `out_dir` (replaced atomically). Returns build info (also saved)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    started = time.perf_counter()
    rows = load_corpus()
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)

    judge = _judge_examples(rows, config.judge_examples, config.seed)
    texts = [f"{r['title']}\n{r['summary']}\n{r['note']}" for r in rows]
    texts += [m[-1]["content"] for m, _ in judge[:50]]
    tokenizer = train_tokenizer(texts, config.vocab_size)
    pad_id = tokenizer.pad_token_id
    eos_id = tokenizer.eos_token_id

    model_config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.hidden_size // config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    model = Qwen3ForCausalLM(model_config)
    model.train()

    # Each example: chat prompt (no loss) + note + <|im_end|> (loss).
    examples = []
    for r in rows:
        prompt = tokenizer.apply_chat_template(
            trading_note_messages(r["title"], r["summary"], "sections"), add_generation_prompt=True, tokenize=False
        )
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        r_ids = tokenizer(r["note"], add_special_tokens=False)["input_ids"] + [eos_id]
        examples.append((p_ids, r_ids))
    judge_batches = []
    for messages, letter in judge:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        judge_batches.append((p_ids, tokenizer(letter, add_special_tokens=False)["input_ids"] + [eos_id]))

    gen = torch.Generator().manual_seed(config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)

    def lr_at(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.train_steps - config.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    optimiser = {k: opt.defaults[k] for k in ("lr", "betas", "eps", "weight_decay", "amsgrad")}
    recipe = hashlib.sha256(json.dumps([asdict(config), optimiser, CLIP_NORM], sort_keys=True).encode())
    losses = []
    for step in range(config.train_steps):
        pool = judge_batches if judge_batches and step % config.judge_every == config.judge_every - 1 else examples
        size = config.batch_size if pool is examples else max(1, config.batch_size // 2)
        idx = torch.randint(len(pool), (size,), generator=gen).tolist()
        batch = [pool[i] for i in idx]
        length = max(len(p) + len(r) for p, r in batch)
        input_ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), length), -100, dtype=torch.long)
        attn = torch.zeros((len(batch), length), dtype=torch.long)
        for b, (p, r) in enumerate(batch):
            seq = p + r
            input_ids[b, : len(seq)] = torch.tensor(seq)
            labels[b, len(p) : len(seq)] = torch.tensor(r)
            attn[b, : len(seq)] = 1
        for part in (input_ids, labels, attn):
            recipe.update(part.numpy().tobytes())
        recipe.update(repr(sched.get_last_lr()).encode())
        loss = model(input_ids=input_ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == config.train_steps - 1:
            log(f"tiny-local step {step}/{config.train_steps} loss {loss.item():.3f}")

    model.eval()
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)
    head = {
        "name": NAME,
        "config": asdict(config),
        "fingerprint": config.fingerprint(),
        "final_loss": losses[-1],
        "recipe_sha256": recipe.hexdigest(),
        "arithmetic": arithmetic(),
    }
    return save_model_folder(out_dir, model, tokenizer, head, started)


def ensure_tiny_local(
    out_dir: Path,
    config: TinyLocalConfig = TinyLocalConfig(),
    rebuild: bool = False,
    log=print,
    bundled: bool = True,
    bundle_root: Path = BUNDLED,
) -> tuple[dict, str]:
    """`(build info, where it came from: existing, prebuilt or built)` (`folder.ensure_folder`). `out_dir` is
    kept when it holds this config's build (same fingerprint: same config and corpus); else the bundled build
    with this fingerprint is copied there when it checks out (`bundle.py`; `bundled=False` skips it); else the
    model is built.
    `rebuild=True` always builds (the `base_model` asset's `rebuild` run config)."""

    def from_bundle(folder: Path) -> dict | None:
        return bundle.install(NAME, config.fingerprint(), folder, log, bundle_root) if bundled else None

    def build(folder: Path) -> dict:
        return build_tiny_local(folder, config, log=log)

    return ensure_folder(out_dir, config.fingerprint(), build, rebuild, from_bundle)


def cached_tiny_local(config: TinyLocalConfig = TinyLocalConfig(), log=print) -> Path:
    """tiny-local once per machine under `.cache/` (tests and benchmarks link it into their data dirs)."""
    path = cache_dir(NAME, config.fingerprint())
    with cache_lock(NAME):
        ensure_tiny_local(path, config, log=log)
    return path


def main(argv: list[str] | None = None) -> None:
    """`python -m outcome_flywheel.models.provision.tiny_local`: see the module docstring."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m outcome_flywheel.models.provision.tiny_local",
        description="tiny-local under .cache/: the bundled build when it checks out, else a build.",
    )
    defaults = TinyLocalConfig()
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--train-steps", type=int, default=defaults.train_steps)
    parser.add_argument("--judge-examples", type=int, default=defaults.judge_examples)
    parser.add_argument("--rebuild", action="store_true", help="build afresh, even when a bundled or cached build fits")
    parser.add_argument(
        "--refresh-bundle",
        metavar="SLOT",
        nargs="?",
        const=NAME,
        help=f"then copy the build into {BUNDLED.relative_to(BUNDLED.parents[3])}/SLOT (default {NAME})",
    )
    args = parser.parse_args(argv)
    config = TinyLocalConfig(seed=args.seed, train_steps=args.train_steps, judge_examples=args.judge_examples)
    path = cache_dir(NAME, config.fingerprint())
    info, source = ensure_tiny_local(path, config, rebuild=args.rebuild)
    print(f"{NAME} {info['fingerprint']}: {source} in {path}, weights {info['weights_sha256']}")
    shipped, why = bundle.find(NAME, config.fingerprint())
    if shipped is not None:
        held = read_build_info(shipped)
        same = held["weights_sha256"] == weights_sha256(path)
        recipes = (held.get("recipe_sha256"), info.get("recipe_sha256"))
        recipe = "an unrecorded" if None in recipes else "the same" if recipes[0] == recipes[1] else "ANOTHER"
        print(f"the bundled {shipped.name} has {'the same' if same else 'other'} weights and {recipe} recipe")
        if not same:
            print(f"  (its arithmetic: {held.get('arithmetic', 'not recorded')}; this build's: {arithmetic()})")
    else:
        print(why)
    if args.refresh_bundle:
        bundle.refresh_bundle(path, args.refresh_bundle)


if __name__ == "__main__":
    main()
