"""Atomic local file writes: a crash leaves the old file (or none), never half a new one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_atomically(path: str | Path, fill: Callable[[str], None], *, durable: bool = True) -> None:
    """Make ``path`` by ``fill``-ing a temp file beside it, then one rename: a crash or a failed ``fill``
    leaves the old file (or none), never half a new one. ``durable`` also fsyncs the data and the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        fill(tmp)
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old file or the new one, never half."""
    replace_atomically(path, lambda tmp: Path(tmp).write_bytes(data))
