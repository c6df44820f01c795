"""`flywheel export SOURCE OUT`: a policy checkpoint or a preference adapter as one standalone Hugging
Face folder (safetensors, tokenizer, chat template), the LoRA merged into the weights with PEFT, that
transformers (or vLLM, or llama.cpp's converter) loads with no adapter and no project code; and a GGUF
file beside it when llama.cpp's converter is installed.

SOURCE: `policy` (the checkpoint `/v1/chat/completions` serves now), `preference` (the latest adapter),
or a folder: a policy checkpoint (`checkpoints/policy/<day>`), an adapter (`adapters/preference/<run>`)
or a full model folder. OUT is written in a staging folder and renamed into place; exporting again
replaces an earlier export whole, never a folder that is not one.

GGUF is an optional extra, not in the default setup: the `gguf` package (in the lock) has no
converter; llama.cpp's `convert_hf_to_gguf.py` does. It is found in FLYWHEEL_LLAMA_CPP_DIR (a llama.cpp
checkout) or on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from outcome_flywheel.models.serve.serving import (
    CHECKPOINT_FILE,
    ModelServer,
    ModelUnavailable,
    adapter_digest,
    read_checkpoint,
)
from outcome_flywheel.settings import resolve_path
from outcome_flywheel.storage import atomic_write_bytes, publish_dir

if TYPE_CHECKING:
    from outcome_flywheel.models.loader import ModelLoader

EXPORT_FILE = "export.json"
GGUF_FILE = "model.gguf"
LLAMA_CPP_VARIABLE = "FLYWHEEL_LLAMA_CPP_DIR"
CONVERTER = "convert_hf_to_gguf.py"
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0", "auto")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)


class ExportError(RuntimeError):
    """An export that cannot be made as asked, with the reason and what to do."""


@dataclass
class Source:
    kind: str  # base | lora | full (policy checkpoints), adapter (a preference adapter), model (a model folder)
    folder: Path
    version: str
    info: dict = field(default_factory=dict)

    @property
    def has_adapter(self) -> bool:
        return self.kind in ("lora", "adapter")


def resolve_source(spec: str, loader: "ModelLoader") -> Source:
    """What SOURCE names (ExportError when it names nothing exportable)."""
    if spec in ("policy", "preference"):
        try:
            found = ModelServer(loader=None, data_root=resolve_path(loader.data_dir)).resolve(spec)
        except ModelUnavailable as err:
            raise ExportError(str(err)) from None
        return Source(found.kind, found.folder, found.version, found.info)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ExportError(
            f"{spec}: no such folder. Give a policy checkpoint (checkpoints/policy/<day>), a preference adapter "
            "(adapters/preference/<run>), a model folder, or `policy` / `preference` for the latest ones"
        )
    path = path.resolve()
    if (path / CHECKPOINT_FILE).exists():
        info = read_checkpoint(path)
        if info is None or info.get("kind") not in ("base", "lora", "full"):
            raise ExportError(f"{path / CHECKPOINT_FILE} is unreadable or names no checkpoint kind (base, lora, full)")
        trained_on = info.get("base_model")
        if trained_on and trained_on != loader.base_model and info["kind"] != "full":
            raise ExportError(
                f"checkpoint {path} was trained on {trained_on!r}, not FLYWHEEL_BASE_MODEL={loader.base_model!r}: "
                f"set FLYWHEEL_BASE_MODEL={trained_on}"
            )
        return Source(info["kind"], path, info.get("policy_version", path.name), info)
    if (path / "adapter_config.json").exists():
        return Source("adapter", path, f"adapter:{path.name}@{adapter_digest(path)}")
    if (path / "config.json").exists() and any(path.glob("*.safetensors")):
        return Source("model", path, f"model:{path.name}")
    raise ExportError(f"{path} holds no checkpoint.json, adapter_config.json or model (config.json + safetensors)")


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} is a file: give a folder to write the export into")
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_FILE).exists():
        raise ExportError(f"{out} exists and is not an earlier export (no {EXPORT_FILE}): refusing to replace it")


def export_merged(source: Source, out: str | Path, loader: "ModelLoader") -> dict:
    """Write the merged model to `out` (a staging folder, then one rename); returns export.json's record."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out).expanduser().resolve()
    _check_out(out)
    started = time.perf_counter()
    base_dir = loader.base_model_dir()
    weights_dir = source.folder if source.kind in ("full", "model") else base_dir
    # fp32 whatever the stored dtype: the LoRA delta is merged without rounding (B @ A * scale is small).
    model = AutoModelForCausalLM.from_pretrained(weights_dir, dtype=torch.float32)
    if source.has_adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, source.folder).merge_and_unload()
    tokenizer_dir = source.folder if (source.folder / "tokenizer_config.json").exists() else base_dir
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.{uuid.uuid4().hex}.staging"
    try:
        model.save_pretrained(staging, safe_serialization=True)
        AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(staging)
        _keep_config_fields(weights_dir / "config.json", staging / "config.json")
        for name in ("generation_config.json", "chat_template.jinja"):
            if not (staging / name).exists() and (base_dir / name).exists():
                shutil.copy2(base_dir / name, staging / name)
        record = {
            "source": str(source.folder),
            "kind": source.kind,
            "version": source.version,
            "merged_lora": source.has_adapter,
            "base_model": loader.base_model,
            "base_model_dir": str(base_dir),
            "dtype": "float32",
            "verified": source.info.get("verified"),
            "gate": source.info.get("gate"),
            "files": sorted(p.name for p in staging.iterdir()),
            "seconds": round(time.perf_counter() - started, 2),
        }
        atomic_write_bytes(staging / EXPORT_FILE, json.dumps(record, indent=1).encode())
        publish_dir(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return record


def _keep_config_fields(source: Path, saved: Path) -> None:
    """Put back the source config's fields transformers' save drops: a top-level `rope_theta` beside
    `rope_parameters` is the one llama.cpp's converter and mlx-lm read (without it they assume
    10,000, and smollm2's 100,000 drifts the logits by nats). The dtype fields stay the export's."""
    if not source.exists():
        return
    original, written = json.loads(source.read_text()), json.loads(saved.read_text())
    missing = {
        k: v
        for k, v in original.items()
        if k not in written and k not in ("torch_dtype", "dtype", "transformers_version", "_name_or_path")
    }
    if missing:
        atomic_write_bytes(saved, json.dumps({**written, **missing}, indent=2, sort_keys=True).encode())


def find_converter() -> Path | None:
    """llama.cpp's convert_hf_to_gguf.py: in FLYWHEEL_LLAMA_CPP_DIR, else on PATH."""
    folder = os.environ.get(LLAMA_CPP_VARIABLE, "").strip()
    if folder:
        script = Path(folder).expanduser() / CONVERTER
        return script if script.is_file() else None
    found = shutil.which(CONVERTER)
    return Path(found) if found else None


def gguf_unavailable() -> str | None:
    """Why no GGUF can be written here (None when it can)."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        return "the `gguf` package is not installed (pip install gguf)"
    if find_converter() is None:
        where = os.environ.get(LLAMA_CPP_VARIABLE)
        return (
            f"{LLAMA_CPP_VARIABLE}={where} holds no {CONVERTER}"
            if where
            else f"llama.cpp's {CONVERTER} is not installed: clone https://github.com/ggml-org/llama.cpp and set "
            f"{LLAMA_CPP_VARIABLE} to it (an optional extra, docs/serving.md)"
        )
    return None


def export_gguf(hf_dir: str | Path, outtype: str = "f16", outfile: str | Path | None = None) -> Path:
    """`hf_dir`/model.gguf (or `outfile`) from the exported folder, through llama.cpp's converter."""
    if outtype not in GGUF_TYPES:
        raise ExportError(f"GGUF type {outtype!r}: one of {', '.join(GGUF_TYPES)}")
    why = gguf_unavailable()
    if why:
        raise ExportError(f"no GGUF written: {why}")
    hf_dir = Path(hf_dir)
    target = Path(outfile) if outfile else hf_dir / GGUF_FILE
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")
    command = [sys.executable, str(find_converter()), str(hf_dir), "--outfile", str(partial), "--outtype", outtype]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise ExportError(f"llama.cpp's converter failed (exit {done.returncode}): {tail}")
    _restore_rope_base(partial, hf_dir / "config.json")
    os.replace(partial, target)
    return target


def _restore_rope_base(gguf_file: Path, config_file: Path) -> None:
    """Write `<arch>.rope.freq_base` when the converter left it out. Converters that read a top-level
    `rope_theta` from transformers' config find none under transformers 5 (it moved to
    `rope_parameters`), and llama.cpp then assumes 10,000: smollm2's 100,000 drifted the logits by
    ~9 (measured). The file is rewritten with the key, tensors copied as they are."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    config = json.loads(config_file.read_text())
    theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta")
    reader = gguf.GGUFReader(gguf_file)
    arch_field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if theta is None or arch_field is None:
        return
    arch = arch_field.contents()
    key = gguf.Keys.Rope.FREQ_BASE.format(arch=arch)
    written = reader.get_field(key)
    if written is not None and abs(float(written.contents()) - float(theta)) <= 1e-6 * float(theta):
        return
    fixed = gguf_file.with_name(gguf_file.name + ".rope")
    writer = gguf.GGUFWriter(fixed, arch=arch, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {key: MetadataDetails(gguf.GGUFValueType.FLOAT32, float(theta))}, [])
    del reader  # its memory map, before the file is replaced
    os.replace(fixed, gguf_file)


def export(
    spec: str, out: str | Path, loader: "ModelLoader", gguf: str = "auto", outtype: str = "f16"
) -> tuple[dict, str]:
    """The whole command: the merged folder, then the GGUF when asked (`gguf`: auto = when the
    converter is installed, always = fail without it, never). Returns (export.json's record, a
    sentence for the user)."""
    if gguf not in ("auto", "always", "never"):
        raise ExportError(f"--gguf {gguf!r}: one of auto, always, never")
    if gguf == "always" and (why := gguf_unavailable()):
        raise ExportError(f"--gguf always: {why}")  # before minutes of merging, not after
    source = resolve_source(spec, loader)
    record = export_merged(source, out, loader)
    out = Path(out).expanduser().resolve()
    message = (
        f"wrote {out}: {source.version} ({source.kind}{', LoRA merged' if source.has_adapter else ''}), "
        f"{len(record['files'])} files, {record['seconds']} s"
    )
    why = gguf_unavailable() if gguf != "never" else "--gguf never"
    if why is None:
        try:
            path = export_gguf(out, outtype)
        except ExportError as err:
            raise ExportError(f"wrote {out} (the Hugging Face folder is usable), but {err}") from None
        record = {**record, "gguf": path.name, "gguf_type": outtype}
        atomic_write_bytes(out / EXPORT_FILE, json.dumps(record, indent=1).encode())
        message += f"; GGUF {path} ({outtype}, {path.stat().st_size / 2**20:.1f} MiB)"
    else:
        message += f"; no GGUF: {why}"
    return record, message
