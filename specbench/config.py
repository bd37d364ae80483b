"""Compose the Hydra configs in ``conf/`` from code, exactly as the command-line apps do."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def group_options(group: str) -> list[str]:
    """The config names of one group (``model``, ``method``, ``dataset``), sorted."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def compose_config(*overrides: str, config_name: str = "config", hydra_node: bool = False) -> DictConfig:
    """``conf/<config_name>.yaml`` with Hydra overrides (``hydra_node`` keeps the ``hydra`` section)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name, overrides=list(overrides), return_hydra_config=hydra_node)
