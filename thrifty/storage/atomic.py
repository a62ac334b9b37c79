"""Atomic local file writes: a crash leaves the old file (or none), never half a new one; and what a crash leaves.

Every temp file is named ``.<name>.<pid>.<random>.tmp`` beside its target, so a later process can
tell one being written (its writer is alive) from a leftover of a killed one (:func:`sweep_dir`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from thrifty.procs import owner_gone

LEGACY_TEMP_AGE_S = 24 * 3600.0  # a temp file named before pids were (no owner to ask) is a leftover after a day


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_beside(path: Path) -> str:
    """A new, empty temp file beside ``path``, named for its owner (this process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    os.close(fd)
    return tmp


def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def stale_temp(path: Path) -> bool:
    """Whether a temp file is a leftover: its writer (the pid in its name) is gone, or was never named."""
    try:
        made = path.stat().st_mtime
    except FileNotFoundError:
        return False
    parts = path.name.split(".")
    pid = int(parts[-3]) if len(parts) >= 4 and parts[-3].isdigit() else None
    if pid is None:
        return time.time() - made > LEGACY_TEMP_AGE_S
    return owner_gone(pid, made)


def sweep_dir(top: Path) -> int:
    """Remove leftover temp files under ``top`` and the directories they leave empty (not ``top``); the count."""
    removed = 0
    if not top.is_dir():
        return 0
    for dirpath, _dirs, files in os.walk(top, topdown=False):
        here = Path(dirpath)
        for name in files:
            if is_temp(name) and stale_temp(here / name):
                (here / name).unlink(missing_ok=True)
                removed += 1
        if here != top:
            with contextlib.suppress(OSError):  # not empty (or gone): leave it
                here.rmdir()
    return removed


@contextlib.contextmanager
def _temp_then_rename(path: Path, durable: bool) -> Iterator[str]:
    """A temp file beside ``path`` to fill; renamed onto ``path`` when the block ends, removed if it raises."""
    tmp = temp_beside(path)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def replace_atomically(path: str | Path, fill: Callable[[str], None], *, durable: bool = True) -> None:
    """Make ``path`` by ``fill``-ing a temp file beside it, then one rename: a crash or a failed ``fill``
    leaves the old file (or none), never half a new one. ``durable`` also fsyncs the data and the directory."""
    with _temp_then_rename(Path(path), durable) as tmp:
        fill(tmp)


@contextlib.contextmanager
def write_atomically(path: str | Path, durable: bool = True) -> Iterator[BinaryIO]:
    """A file to stream into; it appears at ``path`` whole when the block ends, or not at all."""
    with _temp_then_rename(Path(path), durable) as tmp, open(tmp, "wb") as f:
        yield f


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old file or the new one, never half."""
    replace_atomically(path, lambda tmp: Path(tmp).write_bytes(data))
