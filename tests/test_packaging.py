"""A non-editable install works: the wheel carries the configs, and the apps run from any directory."""

from __future__ import annotations

import json
import os
import re
import shlex
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


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv holding the built wheel alone (dependencies seen from this environment,
    offline, through a .pth file): specbench as a user who pip-installed it has it."""
    tmp_path = tmp_path_factory.mktemp("wheel")
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
    return python


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs_from_another_directory(installed, tmp_path, shared_data):
    """Run the tiny model, list the bench suites and the reproduction plan from an unrelated folder, with
    the installed copy (not the checkout)."""
    python = installed
    own_site = python.parent.parent
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


# -- a newcomer's session: the README's commands and the method guide, from the installed wheel ------------

EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The embedded model's Hub id, as the README's commands name it; the test points it at the local copy."""
QUICK = {  # appended to each README command so it runs in seconds (later overrides win over earlier ones)
    "specbench": ["limit=2", "max_new_tokens=8", "warmup=0", "progress=false"],
    "specbench.profile": ["model=tiny_llama", "num_tokens=[1,2]", "context_lengths=[16]", "repeats=1", "warmup=0"],
    "specbench.conformance": ["--checks", "builds", "greedy", "budget", "eos", "knobs"],
}
MY_PROMPTS = [
    {"id": "hello", "prompt": "Say hello in French.", "category": "chat"},
    {"id": "code", "prompt": "Write a Python function that adds two numbers.", "category": "code"},
]


def shell_commands(markdown: str) -> list[str]:
    """The commands of a Markdown text's ```bash blocks: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.DOTALL):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            command = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if command:
                commands.append(" ".join(command.split()))
    return commands


def fenced(markdown: str, language: str) -> list[str]:
    """The bodies of a Markdown text's fenced blocks of one language."""
    return re.findall(rf"```{language}\n(.*?)```", markdown, flags=re.DOTALL)


def run_documented(python: Path, command: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """Run a documented ``python -m ...`` command with the installed python and QUICK's additions."""
    words = shlex.split(command.replace(EMBEDDED_HUB_ID, env["EMBEDDED_DIR"]))
    assert words[:2] == ["python", "-m"], command
    return run([str(python), *words[1:], *QUICK.get(words[2], [])], cwd=cwd, env=env)


def test_every_readme_command_is_run_here_or_is_a_make_target():
    """The README's commands are the ones the newcomer test runs (python -m ...) or Makefile targets."""
    makefile = (ROOT / "Makefile").read_text()
    for command in shell_commands((ROOT / "README.md").read_text()):
        if command.startswith("make "):
            target = command.split()[1]
            assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.MULTILINE), command
        else:
            assert command.startswith("python -m ") or command == ". .venv/bin/activate", command


def test_readme_is_a_path_not_a_record():
    """About 200 lines: the details live in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 210


def test_readme_knob_table_is_the_config():
    """The README's run-settings table lists exactly conf/config.yaml's top-level keys, with their defaults."""
    from omegaconf import OmegaConf

    config = OmegaConf.load(ROOT / "conf" / "config.yaml")
    keys = {key: config._get_node(key)._value() for key in config if key not in ("defaults", "hydra")}
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Run settings") : readme.index("## Methods")]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, flags=re.MULTILINE))
    assert set(rows) == set(keys)

    def shown(value) -> str:
        return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)

    for key, value in keys.items():
        if isinstance(value, str) and "${" in value:
            continue  # output_dir, data_dir: described, not quoted
        if OmegaConf.is_dict(config[key]):  # a node: every sub-key with its default, as `name=value`
            assert all(f"`{name}={shown(sub)}`" in rows[key] for name, sub in config[key].items()), key
            continue
        assert rows[key].strip().strip("`") == shown(value), key


@pytest.mark.slow
def test_a_newcomers_session_from_the_installed_wheel(installed, tmp_path, shared_data):
    """From an installed wheel in an empty folder: the README's path (a model by path, own prompts, a sweep
    with AR, the report, the listings) and the method guide's external method (its module and config
    written from docs/adding-a-method.md, a sweep with AR, the report, the conformance checks)."""
    from specbench.models.embedded import embedded_checkpoint

    home = tmp_path / "newcomer"
    home.mkdir()
    (home / "my_prompts.jsonl").write_text("".join(json.dumps(record) + "\n" for record in MY_PROMPTS))
    env = {
        **os.environ,
        "EMBEDDED_DIR": str(embedded_checkpoint()),
        "SPECBENCH_DATA_DIR": str(shared_data),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(home),  # the user's own module (mydrafts.py), as a user's shell would have it
        "SPECBENCH_VLLM_PYTHON": str(ROOT / ".venv-vllm" / "bin" / "python"),  # engine=vllm: `make test` built it
    }
    outputs = {}
    for command in shell_commands((ROOT / "README.md").read_text()):
        if command.startswith("python -m "):
            outputs[command] = run_documented(installed, command, home, env).stdout
    report = next(out for command, out in outputs.items() if command.startswith("python -m specbench.report"))
    assert {"ar", "pld", "lookahead"} <= set(re.findall(r"\b(ar|pld|lookahead)\b", report))
    summary = json.loads(next((home / "results" / "runs" / "smol" / "my_prompts").glob("*/summary.json")).read_text())
    assert summary["n_samples"] == 2 and summary["dataset"] == "my_prompts"

    guide = (ROOT / "docs" / "adding-a-method.md").read_text()
    (module,) = [block for block in fenced(guide, "python") if "class BigramLookup" in block]
    (config,) = [block for block in fenced(guide, "yaml") if "name: bigram" in block]
    (home / "mydrafts.py").write_text(module)
    (home / "myconf" / "method").mkdir(parents=True)
    (home / "myconf" / "method" / "bigram.yaml").write_text(config)
    for command in shell_commands(guide):
        result = run_documented(installed, command, home, env)
        if "specbench.report" in command:
            bigram = next(line for line in result.stdout.splitlines() if " bigram " in line)
            assert bigram.split()[-1] == "1.00", bigram  # exact match with AR: the last column
        if "specbench.conformance" in command:
            assert "every check passed" in result.stdout, result.stdout
