"""The `base_model` asset: the frozen starting policy both loops build on."""


import time

import dagster as dg
from pydantic import Field

from assets.catalog import MODEL_KINDS, OWNERS
from outcome_flywheel.models import ModelLoader
from outcome_flywheel.models.tiny_local import TinyLocalConfig, ensure_tiny_local


class BaseModelConfig(dg.Config):
    """Run config of `base_model`."""

    rebuild: bool = Field(
        default=False,
        description="tiny-local only: build it again even when a folder with the same fingerprint (config, seed, corpus) exists.",
    )


@dg.asset(
    group_name="models",
    pool="accelerator",
    kinds=MODEL_KINDS,
    owners=OWNERS,
    check_specs=[dg.AssetCheckSpec(
        "loads_and_generates", asset="base_model", blocking=True,
        description="The model folder loads with FLYWHEEL_BACKEND and writes text for a trading-note prompt (greedy, 24 tokens).",
    )],
)
def base_model(context: dg.AssetExecutionContext, config: BaseModelConfig, model_backend: dg.ResourceParam[ModelLoader]):
    """Resolves FLYWHEEL_BASE_MODEL to a model folder. `tiny-local` is built here from bundled
    text (BPE tokenizer, small Qwen3, short training on example notes), deterministically
    from FLYWHEEL_SEED; a hub id is downloaded into the Hugging Face cache; a local folder is
    used as it is."""
    started = time.perf_counter()
    metadata: dict = {"base_model": model_backend.base_model, "backend": model_backend.backend}
    if model_backend.is_tiny_local:
        out_dir = model_backend.tiny_local_dir()
        info, built = ensure_tiny_local(out_dir, TinyLocalConfig(seed=model_backend.seed), config.rebuild, context.log.info)
        metadata["reused_existing_build"] = not built
        metadata.update(
            parameters=info["parameters"], vocab_size=info["vocab_size"], build_seconds=round(float(info["build_seconds"]), 2),
            weights_sha256=info["weights_sha256"], fingerprint=info["fingerprint"],
        )
        path = out_dir
    else:
        path = model_backend.base_model_dir(download=True)

    backend = model_backend.load(model_path=path)
    sample = backend.greedy([[{"role": "user", "content": "Headline: Apple beats estimates. Write a trading note."}]], max_new_tokens=24)[0]
    metadata.update(
        path=dg.MetadataValue.path(str(path)),
        parameters=backend.num_parameters(),
        wall_seconds=round(time.perf_counter() - started, 2),
        sample_text=dg.MetadataValue.md(f"```\n{sample}\n```"),
    )
    if not model_backend.is_tiny_local:
        metadata["vocab_size"] = len(backend.tokenizer) if hasattr(backend, "tokenizer") else -1
    yield dg.MaterializeResult(metadata=metadata)
    yield dg.AssetCheckResult(
        check_name="loads_and_generates", passed=bool(sample.strip()), metadata={"sample": sample[:200]}
    )
