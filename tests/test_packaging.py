"""A non-editable install works: the wheel carries the configs, and the apps run from any directory."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import tomllib

from tests.conftest import ROOT


def test_every_package_is_listed_for_the_wheel():
    """pyproject's explicit package list holds every folder of specbench/ with an __init__.py (and conf)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "specbench").rglob("__init__.py")}
    assert listed == found | {"specbench.conf"}


def run(command: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    """Run a command, failing the test with its output if it fails."""
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs_from_another_directory(tmp_path, shared_data):
    """Build the wheel, install it alone into a new venv (dependencies seen from this environment, offline),
    then run the tiny model, list the bench suites and the reproduction plan from an unrelated folder."""
    wheels = tmp_path / "wheels"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(wheels),
            str(ROOT),
        ],
        cwd=tmp_path,
    )
    wheel = next(wheels.glob("specbench-*.whl"))
    env = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(env)], cwd=tmp_path)
    python = env / "bin" / "python"
    own_site = Path(
        run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path
        ).stdout.strip()
    )
    (own_site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch & co., not specbench
    run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run(
        [str(python), "-c", "import specbench.config as c; print(c.__file__); print(c.CONF_DIR)"], cwd=elsewhere
    ).stdout.split()
    assert all(Path(path).is_relative_to(own_site) for path in where), where  # the installed copy, not the checkout
    out = elsewhere / "run"
    result = run(
        [
            str(python),
            "-m",
            "specbench",
            "model=tiny_llama",
            "limit=1",
            "max_new_tokens=4",
            "warmup=0",
            "progress=false",
            f"output_dir={out}",
            f"data_dir={shared_data}",
        ],
        cwd=elsewhere,
    )
    assert (out / "summary.json").is_file() and "tok/s" in result.stdout
    assert "all_methods" in run([str(python), "-m", "specbench.bench", "--list"], cwd=elsewhere).stdout
    assert (
        "r1_table2_chat"
        in run([str(python), "-m", "specbench.reproduce", "list", "--scale", "smoke"], cwd=elsewhere).stdout
    )
