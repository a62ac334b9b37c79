"""This machine's spool for object-store writes: a file is streamed here, uploaded whole, then removed.

Object stores have no "beside the target" to stage in, so a checkpoint or a metrics file is
written to ``$THRIFTY_SPOOL`` (default ``<temp dir>/thrifty-spool``) under a name that carries
its writer's pid; :func:`sweep_spool` removes what killed writers left.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from thrifty.storage.atomic import sweep_dir, temp_beside


def spool_dir() -> Path:
    return Path(os.environ.get("THRIFTY_SPOOL") or Path(tempfile.gettempdir()) / "thrifty-spool")


def sweep_spool() -> int:
    return sweep_dir(spool_dir())


@contextlib.contextmanager
def spooled(upload: Callable[[str], None], name: str = "object") -> Iterator[BinaryIO]:
    """A local file to stream into; ``upload(path)`` gets it when the block ends; it is removed either way."""
    path = temp_beside(spool_dir() / name)
    try:
        with open(path, "wb") as f:
            yield f
        upload(path)
    finally:
        Path(path).unlink(missing_ok=True)
