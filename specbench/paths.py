"""Where specbench keeps the artefacts it builds once (converted models, drafts, heads, caches)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where specbench keeps derived artefacts (``SPECBENCH_CACHE``, default ~/.cache/specbench)."""
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench"))


def workspace() -> Path:
    """Where the stored results live: the source checkout that holds the package, else the current directory."""
    return checkout() or Path.cwd()


def checkout() -> Path | None:
    """The source checkout that holds the package (None for an installed package)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "conf").is_dir() else None


SHARED_BESIDE = "shared"
"""The folder beside a checkout that holds local copies of the datasets and corpora (``../shared``)."""


def env_or_shared(variable: str, part: str) -> str | None:
    """``${env_or_shared:SPECBENCH_DATA_DIR,datasets}``: the variable when it is set, else ``../shared/<part>`` beside
    the checkout when that folder exists (what ``make`` exports too), else None."""
    if os.environ.get(variable):
        return os.environ[variable]
    root = checkout()
    folder = root.parent / SHARED_BESIDE / part if root is not None else None
    return str(folder) if folder is not None and folder.is_dir() else None
