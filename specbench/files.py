"""Writing files and folders so that readers never see them half-written, and one writer per folder."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specbench.errors import RunConflict


def file_in_the_way(folder: Path) -> Path | None:
    """The regular file at ``folder`` or at one of its parents (no folder can be made there), if there is one."""
    return next((path for path in (folder, *folder.parents) if path.exists() and not path.is_dir()), None)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so readers never see a half-written file; a failed write (full disk) leaves
    ``path`` as it was and no temporary file behind."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def ordinary_modes(folder: Path) -> None:
    """Give ``folder``, its sub-folders and files the modes a new folder or file gets here (0755 / 0644 under the
    usual umask 022): mkdtemp and safetensors' ``save_file`` make them private (0700 / 0600), unlike their
    siblings in a shared cache."""
    umask = os.umask(0)
    os.umask(umask)
    for path in (folder, *folder.rglob("*")):
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """A staging directory beside ``target`` that replaces it only when the ``with`` block succeeds (its files with
    ordinary modes, ``ordinary_modes``)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield staging
        ordinary_modes(staging)
        if target.exists():
            old = target.with_name(f".{target.name}-old")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            staging.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class FolderLock:
    """An exclusive lock on a folder: a lock file holding the holder's pid, host and start time.

    A second process is refused with a ``RunConflict`` naming the holder; a lock whose process is gone
    (killed, crashed) is taken over. Released by ``release`` or, at the latest, when the process exits.
    """

    def __init__(self, folder: Path, name: str = ".lock", what: str = "run folder"):
        self.folder = Path(folder)
        self.path = self.folder / name
        self.what = what
        self.held = False

    def acquire(self) -> FolderLock:
        """Take the lock (creating the folder), or raise RunConflict if a live process holds it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        while True:
            try:
                descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(holder, handle)
            self.held = True
            atexit.register(self.release)
            return self

    def release(self) -> None:
        """Drop the lock if this process holds it."""
        if self.held:
            self.held = False
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _take_over_if_stale(self) -> None:
        """Remove a lock whose holder is no longer running; raise RunConflict if it still is."""
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return  # released meanwhile: try again
        except (OSError, ValueError):
            holder = {}  # torn by a kill between create and write: stale unless very fresh
            try:
                fresh = time.time() - self.path.stat().st_mtime < 5
            except FileNotFoundError:
                return
            if fresh:
                time.sleep(0.1)
                return
        if holder and process_alive(holder.get("pid"), holder.get("host")):
            raise RunConflict(
                f"{self.folder} ({self.what}) is in use by process {holder['pid']} on {holder['host']} (since "
                f"{holder.get('since', '?')}); two writers would mix their results. Wait for it to finish or stop "
                f"it (if it is gone for good, delete {self.path})"
            )
        print(
            f"[specbench] {self.folder}: taking over the lock of process {holder.get('pid', '?')}, which is "
            f"no longer running"
        )
        self.path.unlink(missing_ok=True)


def process_alive(pid: object, host: object) -> bool:
    """Whether ``pid`` runs on this host (a lock from another host counts as alive: it cannot be checked)."""
    if host != socket.gethostname():
        return True
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def building(target: Path) -> FolderLock:
    """The lock of a part being built at ``target`` (a lock file beside it): one builder at a time."""
    return FolderLock(target.parent, name=f".{target.name}.lock", what="part being built")
