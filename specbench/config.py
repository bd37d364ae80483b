"""Compose the Hydra configs from code, exactly as the command-line apps do.

The configs live in the checkout's top-level ``conf/``; a built wheel ships the same files inside the
package (``specbench/conf``, see pyproject.toml), so an installed specbench runs from any directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from specbench.errors import ConfigError, UserError

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
    """``conf/<config_name>.yaml`` with Hydra overrides (``hydra_node`` keeps the ``hydra`` section).

    A bad override (unknown key or option, malformed value) is a ConfigError saying what to write instead.
    """
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            return compose(config_name, overrides=list(overrides), return_hydra_config=hydra_node)
    except HydraException as error:
        raise ConfigError(composition_problem(error)) from error


def composition_problem(error: Exception) -> str:
    """One line saying what is wrong with a command line that Hydra could not compose, and the way out."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    if isinstance(error, MissingConfigException) and error.missing_cfg_file:
        group, _, name = error.missing_cfg_file.rpartition("/")
        choices = error.options or group_options(group)
        return f"unknown {group or 'config'} {name!r}; choose one of {choices}"
    if isinstance(error, OverrideParseException):
        return f"cannot parse the override: {str(error).splitlines()[0]}"
    if isinstance(error.__cause__, (ConfigAttributeError, ConfigKeyError)):
        key = str(error).split("'")[1] if "'" in str(error) else "?"
        return f"unknown setting {key!r}: no such key in the config (check the spelling; `+{key}=...` adds a new key)"
    return " ".join(str(error).split())


def instantiate_checked(node: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` whose UserError (a bad setting caught by a constructor) surfaces as itself.

    Hydra wraps a constructor's exception in ``InstantiationException``; re-raising the cause keeps a
    bad setting a clean ``error:`` line instead of a multi-line report.
    """
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        if isinstance(error.__cause__, UserError):
            raise error.__cause__ from None
        raise
