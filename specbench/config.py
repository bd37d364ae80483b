"""Compose the Hydra configs from code, exactly as the command-line apps do.

The configs live in the checkout's top-level ``conf/``; a built wheel ships the same files inside the
package (``specbench/conf``, see pyproject.toml), so an installed specbench runs from any directory.
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

PACKAGE_DIR = Path(__file__).resolve().parent


def conf_dir() -> Path:
    """The config folder: the one shipped inside an installed wheel, else the checkout's ``conf/``."""
    shipped = PACKAGE_DIR / "conf"
    return shipped if shipped.is_dir() else PACKAGE_DIR.parent / "conf"


CONF_DIR = conf_dir()


def group_options(group: str) -> list[str]:
    """The config names of one group (``model``, ``method``, ``dataset``), sorted."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def compose_config(*overrides: str, config_name: str = "config", hydra_node: bool = False) -> DictConfig:
    """``conf/<config_name>.yaml`` with Hydra overrides (``hydra_node`` keeps the ``hydra`` section)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name, overrides=list(overrides), return_hydra_config=hydra_node)
