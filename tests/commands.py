"""Commands run in the test process as a user runs them (``python -m specbench ...``), without loading a model.

``run_in_process(main, argv)`` runs a command's ``main`` and says how it ended: its exit status, its stderr, or
the exception that escaped it (a traceback). While the ``no_model_loads`` fixture (tests/conftest.py) is active,
every ``load_model`` a command reaches raises ``ModelLoad`` (its input was accepted); with ``Full.runs`` set, the
tiny random model loads and the command runs through. ``in_workspace`` gives a command an empty folder of its own
as its current folder, so relative paths land there, and undoes what the command changed in the environment.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

import specbench.__main__ as specbench_app
import specbench.bench
import specbench.train.draft
import specbench.train.eagle
import specbench.train.hydra
import specbench.train.medusa  # noqa: F401  (imported here, so that their load_model is replaced too)
from specbench.cli import run_hydra_app
from specbench.models import loading

REAL_LOAD_MODEL = loading.load_model


class ModelLoad(BaseException):
    """Raised where a command would load a model: its input was accepted. A BaseException, so that no
    ``except Exception`` of Hydra or of the product takes it for an error."""


class Full:
    """Whether the running command may load the tiny random model and run through (a rare full run)."""

    runs = False


@dataclass
class Outcome:
    """How one command ended: its exit status (None: stopped at the model load), stderr, an escaped exception."""

    code: int | None
    stderr: str
    escaped: BaseException | None = None

    def kind(self) -> str:
        """``exit 0``, ``model load`` (accepted, stopped there), ``error line`` (exit 2), or what else happened."""
        if self.escaped is not None:
            return f"traceback ({type(self.escaped).__name__})"
        return {0: "exit 0", None: "model load", 2: "error line"}.get(self.code, f"exit {self.code}")

    def error_lines(self) -> list[str]:
        """The lines of stderr that start with ``error:``."""
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def stop_at_model_load(model_cfg, *args, **kwargs):
    """The loader every command sees under ``no_model_loads``: ModelLoad, or the tiny random model in a full run."""
    if Full.runs and model_cfg.name == "tiny_llama":
        return REAL_LOAD_MODEL(model_cfg, *args, **kwargs)
    raise ModelLoad()


@contextmanager
def models_stopped(cache: Path, data_dir: Path) -> Iterator[None]:
    """Every module's ``load_model`` stops at the model; ``cache`` as SPECBENCH_CACHE (the embedded tokenizer linked
    into it), ``data_dir`` as SPECBENCH_DATA_DIR; no user config folders, no debug tracebacks."""
    from specbench.models.embedded import embedded_checkpoint

    (cache / embedded_checkpoint().name).symlink_to(embedded_checkpoint())
    with pytest.MonkeyPatch.context() as patch:
        for name, module in list(sys.modules.items()):
            if name.startswith("specbench") and getattr(module, "load_model", None) is REAL_LOAD_MODEL:
                patch.setattr(module, "load_model", stop_at_model_load)
        patch.setenv("SPECBENCH_CACHE", str(cache))
        patch.setenv("SPECBENCH_DATA_DIR", str(data_dir))
        patch.delenv("HYDRA_FULL_ERROR", raising=False)
        patch.delenv("SPECBENCH_CONFIG_PATH", raising=False)
        yield


@contextmanager
def in_workspace() -> Iterator[Path]:
    """A fresh empty folder as the current folder; afterwards the environment as it was (commands add their config
    folders to it), no full run allowed, and the folder removed."""
    here, environment = os.getcwd(), dict(os.environ)
    workspace = Path(tempfile.mkdtemp(prefix="command-"))
    os.chdir(workspace)
    try:
        yield workspace
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environment)
        Full.runs = False
        shutil.rmtree(workspace, ignore_errors=True)


def run_in_process(main: Callable[[list[str]], object], argv: list[str]) -> Outcome:
    """``main(argv)`` with stdout, stderr and warnings captured: its exit status, or the exception that escaped."""
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()), warnings.catch_warnings(record=True):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
        except ModelLoad:
            return Outcome(None, err.getvalue())
        except Exception as error:  # a traceback
            return Outcome(1, err.getvalue(), error)
    return Outcome(0 if code is None else code, err.getvalue())  # type: ignore[arg-type]


def specbench_main(argv: list[str]) -> None:
    """``python -m specbench ARGV`` in this process, started as its ``__main__`` starts it."""
    saved = sys.argv
    sys.argv = ["specbench", *argv]
    try:
        run_hydra_app(specbench_app.main, "config")
    finally:
        sys.argv = saved


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file and folder below ``folder`` (files with their bytes): what a failed command must leave alone."""
    return {str(path.relative_to(folder)): path.read_bytes() if path.is_file() else b"/" for path in folder.rglob("*")}
