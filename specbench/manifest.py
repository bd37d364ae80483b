"""Manifests of trained parts (distilled drafts, Medusa and EAGLE heads): proof that a part is complete.

A trainer writes ``manifest.json`` as the LAST file of the part's folder, inside the atomic staging
folder (``files.atomic_dir``), so it exists only when every other file does. It records what the part
was trained from (settings and data digests), how far training got (steps done and planned, what
stopped it), the accuracy measured, and a digest of the weight files that names the part in every run
that uses it. Loaders go through ``finished_manifest``: a folder without a finished manifest (a
training cut short, a partial copy, a part trained by an older specbench) is never used silently, and
the weight files are hashed again at every load and must match the manifest's digest (``check_weights``),
so the name a run records is the digest of the bytes it loaded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specbench.errors import ModelUnavailable
from specbench.files import atomic_dir

MANIFEST = "manifest.json"
MANIFEST_VERSION = "specbench.manifest/1"
TRAINING_FILE = "training.json"
"""The training record a trainer writes beside its part (settings, data, loss curve, accuracy)."""


def digest(obj) -> str:
    """A short sha256 of a JSON-serializable object (settings, token lists, search keys), stable across runs."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def model_identity(model) -> dict:
    """What decides a loaded model's outputs, as part keys record it: its weights' origin, dtype and architecture."""
    config = {k: v for k, v in model.config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    return {"path": str(getattr(model, "name_or_path", "")), "dtype": str(model.dtype), "config": digest(config)}


def files_digest(folder: Path, names: list[str]) -> str:
    """sha256 (16 hex digits) over the named files' bytes, in order: the identity of trained weights."""
    digest = hashlib.sha256()
    for name in names:
        with open(folder / name, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def write_manifest(
    folder: Path,
    kind: str,
    weight_files: list[str],
    settings_digest: str,
    data_digest: str | None,
    steps_done: int,
    steps_planned: int | None,
    stopped_by: str,
    accuracy: Any = None,
) -> dict:
    """Write ``folder/manifest.json`` (call it last, inside the staging folder); returns its content."""
    manifest = {
        "schema": MANIFEST_VERSION,
        "kind": kind,
        "finished": True,  # written only once training ended by its own schedule and every file is saved
        "weights_digest": files_digest(folder, weight_files),
        "weight_files": weight_files,
        "settings_digest": settings_digest,
        "data_digest": data_digest,
        "steps_done": steps_done,
        "steps_planned": steps_planned,
        "stopped_by": stopped_by,
        "accuracy": accuracy,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def read_manifest(folder: Path) -> dict | None:
    """The folder's manifest, or None when it has none or it cannot be read."""
    path = Path(folder) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def trained_with(folder: Path, settings_digest: str) -> bool:
    """Whether ``folder`` holds a part whose training finished with exactly these settings."""
    manifest = read_manifest(folder)
    return bool(manifest and manifest.get("finished") and manifest.get("settings_digest") == settings_digest)


def finished_training(folder: Path, settings_digest: str) -> dict | None:
    """The saved training record when ``folder`` holds a part whose training finished with these settings."""
    if not trained_with(folder, settings_digest):
        return None
    return json.loads((Path(folder) / TRAINING_FILE).read_text(encoding="utf-8"))


def finished_manifest(folder: Path, kind: str, train_command: str) -> dict:
    """The manifest of a trained part that may be used, or ModelUnavailable saying how to (re)train it."""
    manifest = read_manifest(folder)
    if manifest is None:
        raise ModelUnavailable(
            f"the {kind} in {folder} has no manifest.json: its training did not finish, the folder is a partial "
            f"copy, or an older specbench trained it; it is not used. Train it again: `{train_command} force=true`"
        )
    if not manifest.get("finished"):
        raise ModelUnavailable(
            f"the {kind} in {folder} is unfinished ({manifest.get('steps_done')} of "
            f"{manifest.get('steps_planned')} steps, stopped by {manifest.get('stopped_by')}); it is not used. "
            f"Finish it: `{train_command} force=true`"
        )
    check_weights(folder, kind, manifest, train_command)
    return manifest


def check_weights(folder: Path, kind: str, manifest: dict, train_command: str) -> None:
    """ModelUnavailable unless the weight files hash to the manifest's digest: a part is identified by its bytes,
    so a run (or a resume) never records an edited manifest or weights changed under an unchanged one."""
    names = manifest.get("weight_files") or sorted(path.name for path in Path(folder).glob("*.safetensors"))
    retrain = f"Train it again: `{train_command} force=true`"
    try:
        actual = files_digest(Path(folder), names)
    except OSError as error:
        raise ModelUnavailable(
            f"the {kind} in {folder} lacks a weight file its manifest names ({error}). {retrain}"
        ) from None
    if actual != manifest.get("weights_digest"):
        raise ModelUnavailable(
            f"the {kind} in {folder} is not what its manifest says: its weights hash to {actual}, the manifest "
            f"names {manifest.get('weights_digest')} (edited, replaced or corrupted after training); it is not used. "
            f"{retrain}"
        )


def part_name(kind: str, folder: Path | str, manifest: dict | None) -> str:
    """How a run names a part it used: ``<kind>:<weights digest>`` for trained parts, else where it came from."""
    return f"{kind}:{manifest['weights_digest']}" if manifest else f"{kind}:{folder}"


def write_checkpoint(folder: Path, weight_file: str, state: dict, config_file: str, config: dict) -> None:
    """Write a part's weights (safetensors) and its config into ``folder``: a trained part's files, or a random
    part's that an engine loading from files (vLLM) reads."""
    from safetensors.torch import save_file

    save_file({key: value.detach().contiguous().cpu() for key, value in state.items()}, str(folder / weight_file))
    (folder / config_file).write_text(json.dumps(config, indent=2) + "\n")


def save_trained_heads(
    folder: Path, kind: str, weight_file: str, state: dict, config_file: str, config: dict, training: dict
) -> None:
    """Write a trained head part into ``folder`` atomically (replacing what was there): the weights
    (safetensors), its config, the training record and, last, the manifest (``training`` holds ``digest``,
    ``data``, ``result`` and ``accuracy``)."""
    with atomic_dir(folder) as staging:
        write_checkpoint(staging, weight_file, state, config_file, config)
        (staging / TRAINING_FILE).write_text(json.dumps(training, indent=2) + "\n")
        result = training["result"]
        write_manifest(
            staging,
            kind,
            [weight_file],
            training["digest"],
            training.get("data"),
            result["steps"],
            result["steps_planned"],
            result["stopped_by"],
            {"top1": (training.get("accuracy") or {}).get("top1")},
        )
