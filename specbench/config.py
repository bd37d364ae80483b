"""Compose the Hydra configs from code, exactly as the command-line apps do.

The configs live in the checkout's top-level ``conf/``; a built wheel ships the same files inside the
package (``specbench/conf``, see pyproject.toml), so an installed specbench runs from any directory.

A user's own configs (a method, a dataset, a model, a bench suite) live in folders of the same layout
outside the package, named by ``SPECBENCH_CONFIG_PATH`` (``os.pathsep``-separated folders, ``file://``
URLs or ``pkg://package`` names). The command-line apps add the folders given as ``--config-dir`` /
``-cd`` or ``hydra.searchpath=[...]`` to it (``specbench.cli``), so every composition, every listing
of a group's options and every child process sees the same configs (docs/extending.md).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from specbench.errors import ConfigError, UserError
from specbench.paths import env_or_shared

PACKAGE_DIR = Path(__file__).resolve().parent


def conf_dir() -> Path:
    """The config folder: the one shipped inside an installed wheel, else the checkout's ``conf/``."""
    shipped = PACKAGE_DIR / "conf"
    return shipped if shipped.is_dir() else PACKAGE_DIR.parent / "conf"


CONF_DIR = conf_dir()
CONFIG_PATH_ENV = "SPECBENCH_CONFIG_PATH"


def file_stem(path: str | None, default: str) -> str:
    """``${file_stem:${.path},prompts}``: a file's name without folder and suffix (``default`` without a file),
    so a dataset read from the user's file is named after it."""
    return Path(str(path)).stem if path else default


def suffix(prefix: str, value: object) -> str:
    """``${suffix:-b,${budget}}``: ``prefix`` + value, or nothing when the value is null (folder names that only
    grow a part when a setting is used)."""
    return "" if value is None else f"{prefix}{value}"


COMPILE_SETTINGS = (True, False, "auto")
"""The values of the ``compile`` run setting (the compiled path: ``specbench.core.compiled``)."""


def compile_enabled(setting: object, device_type: str) -> bool:
    """Resolve ``compile`` (true | false | auto) on a device type: auto is on for CUDA, where kernel launches bound a
    step at batch 1, off on CPU."""
    if setting not in COMPILE_SETTINGS:
        raise ConfigError(f"compile must be true, false or auto (got {setting!r})")
    return device_type == "cuda" if isinstance(setting, str) else bool(setting)


def compiled_suffix(setting: object, device: object) -> str:
    """``${compiled_suffix:${compile},${device}}``: ``-compiled`` in the folder of a run that takes the compiled path,
    nothing for an eager run (so eager folders keep their names); a bad value is left to the run's validation."""
    if setting not in COMPILE_SETTINGS:
        return ""
    import torch  # here: only a folder name that asks for compile=auto needs it

    on_cuda = str(device).startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return "-compiled" if compile_enabled(setting, "cuda" if on_cuda else "cpu") else ""


def load_folder(batch_size: int, concurrency: int | None) -> str:
    """``${load_folder:${batch_size},${concurrency}}``: how requests reach an engine, in a folder name: ``-c8`` (8 in
    flight against a server) or ``-b4`` (offline batches of 4)."""
    return f"-b{batch_size}" if concurrency is None else f"-c{concurrency}"


def add(*terms: object) -> int:
    """``${add:${method.drafter.block_size},-1}``: the sum of integer config values (DFlash's vLLM token count)."""
    return sum(int(str(term)) for term in terms)


for name, resolver in (
    ("add", add),
    ("file_stem", file_stem),
    ("suffix", suffix),
    ("load_folder", load_folder),
    ("compiled_suffix", compiled_suffix),
    ("env_or_shared", env_or_shared),
):
    if not OmegaConf.has_resolver(name):
        OmegaConf.register_new_resolver(name, resolver)


def folder_of(entry: str) -> Path:
    """The folder a search-path entry names: a path, a ``file://`` URL or a ``pkg://package``."""
    if entry.startswith("pkg://"):
        module = entry.removeprefix("pkg://").replace("/", ".")
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"config search path entry {entry!r}: no importable package {module!r}")
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(entry.removeprefix("file://")).expanduser().resolve()


def user_config_dirs() -> list[Path]:
    """The user's config folders named by ``SPECBENCH_CONFIG_PATH``, in order; a missing one is a ConfigError."""
    entries = [entry for entry in os.environ.get(CONFIG_PATH_ENV, "").split(os.pathsep) if entry]
    folders = []
    for entry in entries:
        folder = folder_of(entry)
        if not folder.is_dir():
            raise ConfigError(f"{CONFIG_PATH_ENV} names {entry!r}, which is not a folder")
        if folder not in folders:
            folders.append(folder)
    return folders


def add_user_config_dirs(folders: list[str]) -> None:
    """Put folders at the front of ``SPECBENCH_CONFIG_PATH`` for this process and its children."""
    known = [entry for entry in os.environ.get(CONFIG_PATH_ENV, "").split(os.pathsep) if entry]
    fresh = [str(folder_of(folder)) for folder in folders]
    os.environ[CONFIG_PATH_ENV] = os.pathsep.join(dict.fromkeys([*fresh, *known]))


def config_dirs() -> list[Path]:
    """Every config folder, the packaged one first (Hydra finds a name there before the user's)."""
    return [CONF_DIR, *(folder for folder in user_config_dirs() if folder != CONF_DIR)]


def find_config(group: str, name: str) -> Path | None:
    """The YAML file of config ``group/name`` (first folder that has it), or None."""
    for folder in config_dirs():
        path = folder / group / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def is_group(group: str) -> bool:
    """Whether ``group`` is a config group (a folder of configs) in any config folder."""
    return any((folder / group).is_dir() for folder in config_dirs())


def group_options(group: str) -> list[str]:
    """The config names of one group (``model``, ``method``, ``dataset``) in every config folder, sorted."""
    return sorted({path.stem for folder in config_dirs() for path in (folder / group).glob("*.yaml")})


def search_path_override() -> str | None:
    """``hydra.searchpath=[file://...]`` naming the user's config folders (None when there are none)."""
    folders = user_config_dirs()
    if not folders:
        return None
    return "hydra.searchpath=[" + ",".join(f"file://{folder}" for folder in folders) + "]"


def without_search_path(overrides: list[str]) -> list[str]:
    """The overrides less any ``hydra.searchpath=`` (its folders are in ``SPECBENCH_CONFIG_PATH`` already)."""
    return [override for override in overrides if not override.lstrip("+~").startswith("hydra.searchpath=")]


def compose_config(*overrides: str, config_name: str = "config", hydra_node: bool = False) -> DictConfig:
    """``conf/<config_name>.yaml`` with Hydra overrides (``hydra_node`` keeps the ``hydra`` section).

    A bad override (unknown key or option, malformed value) is a ConfigError saying what to write instead.
    """
    from hydra.errors import HydraException

    check_group_choices(overrides)
    search_path = search_path_override()
    given = [*without_search_path(list(overrides)), *([search_path] if search_path else [])]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            return compose(config_name, overrides=given, return_hydra_config=hydra_node)
    except HydraException as error:
        raise ConfigError(composition_problem(error)) from error


def check_group_choices(overrides: Sequence[str]) -> None:
    """A ConfigError for a config group set to something other than config names (``model=null``,
    ``model=[1,2]``), which Hydra meets with a ValueError or TypeError; an unknown name is Hydra's to report."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return  # a malformed override: compose reports it
    for override in parsed:
        group = override.key_or_group
        if override.is_delete() or override.is_sweep_override() or group.startswith("hydra") or not is_group(group):
            continue
        value = override.value()
        for choice in value if isinstance(value, list) else [value]:
            if not isinstance(choice, str):
                raise ConfigError(f"unknown {group} {choice!r}; choose one of {group_options(group)}")


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
