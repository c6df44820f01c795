"""Qwen3 as it really is, built on this machine (the hub cannot be reached here):

- `QWEN3_CHAT_TEMPLATE`: ChatML with Qwen3's reasoning convention. Earlier assistant turns lose
  their `<think>` block; the generation prompt opens the assistant turn and, with
  `enable_thinking=False`, closes an empty think block (`<think>\\n\\n</think>\\n\\n`), as a Qwen3
  folder's template does. The template here is written for this project, after that behaviour.
- `qwen3_tokenizer`: a byte-level BPE trained on the bundled notes with Qwen3's special tokens
  (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) and `<think>` / `</think>` as added, non-special
  tokens (so decoding keeps them, as Qwen3's does).
- `build_model(folder, shape)`: a randomly initialised Qwen3 of a named shape. `qwen3-0.6b` is
  Qwen/Qwen3-0.6B's exact configuration (28 layers, 16 query / 8 key-value heads of 128, hidden
  1024, intermediate 3072, vocabulary 151,936, tied embeddings): for speed and memory figures
  only, never for the demo (random weights write noise). `wide-vocab-toy` keeps that
  vocabulary with a tiny body (the memory benchmark and tests); `qwen3-tiny` is a small model
  over the fixture tokenizer (template and thinking tests; CPU smoke runs).
"""

from __future__ import annotations

import json
from pathlib import Path

QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- set content = message['content'] -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

QWEN3_VOCAB = 151_936

# Qwen/Qwen3-0.6B's config.json, the fields that fix the shape and the arithmetic.
QWEN3_0_6B = dict(
    vocab_size=QWEN3_VOCAB,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_bias=False,
)

SHAPES: dict[str, dict] = {
    "qwen3-0.6b": QWEN3_0_6B,
    "wide-vocab-toy": dict(
        QWEN3_0_6B,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
    ),
    # vocab_size None: the fixture tokenizer's own size
    "qwen3-tiny": dict(
        QWEN3_0_6B,
        vocab_size=None,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
}


def qwen3_tokenizer(vocab_size: int = 2048):
    """The fixture tokenizer: trained on the bundled corpus, Qwen3's special and think tokens, the
    Qwen3-style template."""
    from outcome_flywheel.models.provision.tiny_local import load_corpus, train_tokenizer

    rows = load_corpus()
    tokenizer = train_tokenizer([f"{r['title']}\n{r['summary']}\n{r['note']}" for r in rows], vocab_size)
    tokenizer.add_tokens(["<think>", "</think>"])  # added, not special: decode keeps them (as Qwen3)
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer


def model_config(shape: str, tokenizer):
    """A transformers `Qwen3Config` of the named shape for this tokenizer's special tokens."""
    from transformers import Qwen3Config

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
    fields = dict(SHAPES[shape])
    fields["vocab_size"] = fields["vocab_size"] or len(tokenizer)
    if fields["vocab_size"] < len(tokenizer):
        raise ValueError(f"shape {shape} has {fields['vocab_size']} ids, the tokenizer {len(tokenizer)}")
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    return Qwen3Config(**fields, bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)


def build_model(
    out_dir: str | Path,
    shape: str,
    dtype: str = "float32",
    device: str = "cpu",
    seed: int = 0,
    fill_vocab: bool = False,
) -> Path:
    """Write a randomly initialised model of `shape` with the fixture tokenizer into `out_dir` (a
    Hugging Face folder both backends load). Initialised on `device` in `dtype` (bf16 on CUDA for
    qwen3-0.6b: 0.6B parameters initialise in seconds there). `fill_vocab`: give every id of the
    shape's vocabulary a token (`<rN>`), so whatever the random model samples decodes to text (the
    Dagster assets check that the base model writes text); it makes loading the tokenizer slower."""
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen3_tokenizer()
    if fill_vocab and SHAPES[shape]["vocab_size"]:
        from tokenizers import AddedToken

        tokenizer.add_tokens(
            [AddedToken(f"<r{i}>", normalized=False) for i in range(SHAPES[shape]["vocab_size"] - len(tokenizer))]
        )
    config = model_config(shape, tokenizer)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig(eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
    (out / "shape.json").write_text(json.dumps({"shape": shape, "dtype": dtype, "seed": seed, "random_init": True}))
    return out


def parameter_bytes(shape: str, bytes_per_parameter: int = 2) -> int:
    """Bytes of the weights of `shape` (tied embeddings counted once): what each decode step reads."""
    s = SHAPES[shape]
    hidden, inter, heads, kv, head_dim = (
        s["hidden_size"],
        s["intermediate_size"],
        s["num_attention_heads"],
        s["num_key_value_heads"],
        s["head_dim"],
    )
    attention = hidden * head_dim * (heads + 2 * kv) + heads * head_dim * hidden + 2 * head_dim  # q,k,v,o + q/k norms
    mlp = 3 * hidden * inter
    per_layer = attention + mlp + 2 * hidden
    embeddings = (s["vocab_size"] or 0) * hidden * (1 if s["tie_word_embeddings"] else 2)
    return (s["num_hidden_layers"] * per_layer + embeddings + hidden) * bytes_per_parameter


def kv_bytes_per_token(shape: str, bytes_per_value: int = 2) -> int:
    """KV-cache bytes one token of context holds (keys and values, every layer)."""
    s = SHAPES[shape]
    return 2 * s["num_hidden_layers"] * s["num_key_value_heads"] * s["head_dim"] * bytes_per_value


def benchmark_model(out_dir: str | Path, shape: str) -> Path:
    """`--shape` of the benchmarks: the shape built with random weights in bf16 on CUDA (fp32 on the
    CPU, where bf16 has no fast path). For speed and memory figures only."""
    import torch

    cuda = torch.cuda.is_available()
    return build_model(out_dir, shape, dtype="bfloat16" if cuda else "float32", device="cuda" if cuda else "cpu")
