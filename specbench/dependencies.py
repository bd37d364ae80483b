"""The dependency set a run was measured with, and how it compares to the project's lock.

Every run records the exact versions of specbench's runtime dependencies (the installed closure of its
requirements), a digest of that set, and whether the installed versions are the ones pinned in
``requirements/lock-cpu.txt`` (docs/environment.md#drift). The report and the reproduction tables warn
when runs of different dependency sets are compared.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
from functools import cache
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOCK_PATH = PROJECT_ROOT / "requirements" / "lock-cpu.txt"
DIGEST_CHARS = 12
MISMATCHES_SHOWN = 10


def read_pins(path: Path) -> dict[str, str]:
    """{canonical name: version} of every ``name==version`` line of a pip requirements file (hashes ignored)."""
    pins = {}
    for line in path.read_text().splitlines():
        text = line.split("#", 1)[0].strip().rstrip("\\").strip()
        if not text or text.startswith("-"):
            continue
        name, separator, version = text.partition("==")
        if separator:
            pins[canonicalize_name(name)] = version.split(";", 1)[0].strip()
    return pins


def _installed_version(name: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _requirements_of(name: str) -> list[Requirement]:
    """The runtime requirements an installed distribution declares whose markers hold here (no extras)."""
    found = []
    for text in metadata.requires(name) or []:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            found.append(requirement)
    return found


@cache
def runtime_versions(root: str = "specbench") -> dict[str, str]:
    """{name: version} of the installed runtime closure of ``root``'s requirements (``root`` itself excluded).

    Outside an installed specbench (a bare checkout on ``PYTHONPATH``) the lock's packages stand in for
    the closure, so the record still names what was imported.
    """
    if _installed_version(root) is None:
        names = sorted(read_pins(LOCK_PATH)) if LOCK_PATH.is_file() else []
        return {name: version for name in names if (version := _installed_version(name)) is not None}
    versions: dict[str, str] = {}
    pending = [root]
    while pending:
        for requirement in _requirements_of(pending.pop()):
            name = canonicalize_name(requirement.name)
            version = _installed_version(name)
            if name not in versions and version is not None:
                versions[name] = version
                pending.append(name)
    return dict(sorted(versions.items()))


def digest(versions: dict[str, str]) -> str:
    """A short digest of a dependency set: equal digests, equal versions of every package."""
    text = "\n".join(f"{name}=={version}" for name, version in sorted(versions.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def lock_mismatches(pins: dict[str, str]) -> list[str]:
    """``name installed X, lock Y`` for every locked package installed at another version (or missing)."""
    found = []
    for name, pinned in sorted(pins.items()):
        installed = _installed_version(name)
        if installed != pinned:
            found.append(f"{name} installed {installed or 'nothing'}, lock {pinned}")
    return found


def lock_state(path: Path = LOCK_PATH) -> dict:
    """The lock's digest and whether the installed set is the locked one (all None without a lock file)."""
    if not path.is_file():
        return {"lock_digest": None, "lock_matches": None, "lock_mismatches": []}
    mismatches = lock_mismatches(read_pins(path))
    return {
        "lock_digest": hashlib.sha256(path.read_bytes()).hexdigest()[:DIGEST_CHARS],
        "lock_matches": not mismatches,
        "lock_mismatches": mismatches[:MISMATCHES_SHOWN],
    }


def capture() -> dict:
    """The environment record's dependency part: versions, their digest, and the lock comparison."""
    versions = runtime_versions()
    return {"dependencies": versions, "dependencies_digest": digest(versions), **lock_state()}


def dependency_label(environment: dict) -> str:
    """What tells a run's dependency set apart: its digest, or, for runs recorded before the digest
    existed, the torch and transformers versions they did record."""
    recorded = environment.get("dependencies_digest")
    if recorded:
        return str(recorded)
    return f"torch {environment.get('torch', '?')}, transformers {environment.get('transformers', '?')}"
