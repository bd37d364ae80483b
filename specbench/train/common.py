"""Helpers every ``specbench.train`` command shares: config, digests, the target, JSON outputs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.config import compose_config
from specbench.errors import ConfigError
from specbench.models.loading import LoadedModel, load_model, resolve_device, resolve_dtype


def compose_train(command: str, overrides: list[str]) -> DictConfig:
    """``conf/train/<command>.yaml`` with Hydra overrides; a bad override is a one-line ConfigError."""
    from hydra.errors import HydraException

    try:
        return compose_config(*overrides, config_name=f"train/{command}")
    except HydraException as error:
        raise ConfigError(f"invalid override for `specbench.train {command}`: {error}") from None


def digest(obj) -> str:
    """A short sha256 of a JSON-serializable object (settings, token lists), stable across runs."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def container(node) -> dict:
    """A config node as plain, resolved Python data (for digests and JSON records)."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def model_identity(lm: LoadedModel) -> dict:
    """What determines a target's outputs: name, weights location, dtype and architecture."""
    config = lm.model.config.to_dict()
    arch = {k: v for k, v in config.items() if not k.startswith("_") and k != "transformers_version"}
    return {"name": lm.name, "path": lm.path, "dtype": str(lm.model.dtype), "config": digest(arch)}


def load_target(cfg: DictConfig) -> LoadedModel:
    """The target named by ``cfg.model`` on ``cfg.device`` in ``cfg.dtype`` (frozen, eval mode)."""
    device = resolve_device(cfg.device)
    lm = load_model(cfg.model, device, resolve_dtype(cfg.dtype, device))
    lm.model.requires_grad_(False)
    return lm


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as indented JSON (the caller makes the enclosing directory atomic)."""
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
