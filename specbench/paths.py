"""Where specbench keeps the artefacts it builds once (converted models, drafts, heads, caches)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where specbench keeps derived artefacts (``SPECBENCH_CACHE``, default ~/.cache/specbench)."""
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench"))


def workspace() -> Path:
    """Where the stored results live: the source checkout that holds the package, else the current directory."""
    checkout = Path(__file__).resolve().parent.parent
    return checkout if (checkout / "pyproject.toml").is_file() and (checkout / "conf").is_dir() else Path.cwd()


def distilled_draft_dir(target_name: str) -> Path:
    """Where the distilled draft of ``target_name`` lives (``model.draft.source=distilled``)."""
    return cache_root() / "drafts" / f"{target_name}-distilled"
