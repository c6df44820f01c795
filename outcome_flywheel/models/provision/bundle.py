"""Built model folders shipped in the repository (`bundled/<slot>/`), used instead of a build when
they check out, and refreshed from a build.

A bundled folder is a build's folder as the builder wrote it (weights, tokenizer, config,
`build_info.json`) plus `bundle.json`: the sha256 of every file. It stands in for a build of a
config only when all of these hold, else the caller builds (and a log line says why):

1. its `build_info.json` records the config's fingerprint (same config, same corpus);
2. the weights' content hash (`weights_sha256`, tensor by tensor) equals the recorded one;
3. every other file's sha256 equals `bundle.json`'s, and no file is missing.

It is copied (not linked) into the folder asked for, `bundle.json` left out, so that folder is
byte for byte what the builder writes. `refresh_bundle` writes a slot from a built folder
(`python -m outcome_flywheel.models.provision.tiny_local --rebuild --refresh-bundle`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from outcome_flywheel.models.provision.folder import BUILD_INFO, read_build_info, staged_folder, weights_sha256

BUNDLED = Path(__file__).resolve().parent / "bundled"
MANIFEST = "bundle.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _slots(root: Path, name: str) -> list[Path]:
    """Bundled folders of the model `name` (their `build_info.json` says so), by slot name."""
    if not root.is_dir():
        return []
    slots = []
    for folder in sorted(root.iterdir()):
        try:
            info = read_build_info(folder) or {}
        except ValueError:  # a build_info.json that is not JSON: no slot (`find` then names what is there)
            continue
        if info.get("name") == name:
            slots.append(folder)
    return slots


def verify(folder: Path) -> str | None:
    """None when the bundled folder is intact (checks 2 and 3 above), else what is wrong."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST
    if not manifest_path.exists():
        return f"{folder} has no {MANIFEST}"
    files = json.loads(manifest_path.read_text())["files"]
    present = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)
    if present != sorted(files):
        return f"{folder} holds {present}, {MANIFEST} lists {sorted(files)}"
    recorded = read_build_info(folder)["weights_sha256"]
    actual = weights_sha256(folder)
    if actual != recorded:
        return f"the weights in {folder} hash to {actual[:16]}, build_info.json records {recorded[:16]}"
    changed = [name for name, digest in files.items() if _sha256(folder / name) != digest]
    if changed:
        return f"{', '.join(changed)} in {folder} differ from {MANIFEST}'s sha256"
    return None


def find(name: str, fingerprint: str, root: Path = BUNDLED) -> tuple[Path | None, str]:
    """`(the bundled folder of this build, "")`, or `(None, why none can stand in for it)`."""
    slots = _slots(Path(root), name)
    match = next((p for p in slots if read_build_info(p).get("fingerprint") == fingerprint), None)
    if match is None:
        held = ", ".join(f"{p.name}: {read_build_info(p).get('fingerprint')}" for p in slots) or "none"
        return None, f"no bundled {name} has fingerprint {fingerprint} (bundled: {held})"
    try:
        problem = verify(match)
    except Exception as err:  # a truncated safetensors file, a manifest that is not JSON
        problem = f"{match} does not read: {type(err).__name__}: {err}"
    return (None, f"the bundled {match.name} is refused: {problem}") if problem else (match, "")


def install(name: str, fingerprint: str, out_dir: Path, log=print, root: Path = BUNDLED) -> dict | None:
    """Copy the bundled build with this fingerprint into `out_dir` (replaced atomically) and return
    its build info; None, with a log line saying why, when no bundled folder checks out."""
    folder, why = find(name, fingerprint, root)
    if folder is None:
        log(f"{name}: {why}; building it")
        return None

    def write(staging: Path) -> dict:
        for file in folder.iterdir():
            if file.is_file() and file.name not in (MANIFEST, BUILD_INFO):
                shutil.copyfile(file, staging / file.name)
        return read_build_info(folder)

    info = staged_folder(out_dir, write)
    log(
        f"{name}: the bundled build {fingerprint} (weights {info['weights_sha256'][:16]}, verified) copied to {out_dir}"
    )
    return info


def refresh_bundle(model_dir: Path, slot: str, root: Path = BUNDLED, log=print) -> Path:
    """Make `root/slot` a copy of the built folder `model_dir`, with its `bundle.json`; returns it."""
    model_dir = Path(model_dir)
    info = read_build_info(model_dir)
    if info is None or weights_sha256(model_dir) != info["weights_sha256"]:
        raise ValueError(f"{model_dir} is not a finished build (no build_info.json, or weights that differ from it)")

    def write(staging: Path) -> dict:
        files = {}
        for file in sorted(model_dir.iterdir()):
            if file.is_file() and file.name not in (MANIFEST, BUILD_INFO):
                shutil.copyfile(file, staging / file.name)
                files[file.name] = _sha256(file)
        files[BUILD_INFO] = hashlib.sha256(json.dumps(info, indent=2).encode()).hexdigest()
        manifest = {"name": info["name"], "fingerprint": info["fingerprint"], "files": dict(sorted(files.items()))}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        return info

    target = Path(root) / slot
    staged_folder(target, write)
    target.chmod(0o755)  # mkdtemp's 0700 would travel into the repository
    log(f"{info['name']}: bundled {info['fingerprint']} (weights {info['weights_sha256'][:16]}) in {target}")
    return target
