"""One Store over string URIs: shards, checkpoints, metrics and ledgers all go through it.

Keys are '/'-separated strings relative to the store root; a URI never passes through
``Path`` unless it is a local one. Every write is atomic for readers: an object is either
absent or complete. Cloud backends (s3://, gs://, az://) plug in behind the same protocol.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol
from urllib.parse import urlparse


class StoreError(RuntimeError):
    """A store cannot be used as configured (missing, denied, unsupported)."""


class NotFound(KeyError):
    """No object at that key."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: dt.datetime
    storage_class: str


class Store(Protocol):
    uri: str

    def put_bytes(self, key: str, data: bytes) -> None: ...
    def get_bytes(self, key: str) -> bytes: ...
    def put_file(self, key: str, local_path: str | Path) -> None: ...
    def get_file(self, key: str, local_path: str | Path) -> None: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str = "") -> list[ObjectInfo]: ...
    def delete(self, key: str) -> None: ...
    def local_path(self, key: str) -> Path | None:
        """A path readable in place (file stores), or None where the object must be fetched."""
        ...


def _clean_key(key: str) -> str:
    parts = [p for p in key.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts) or not parts:
        raise ValueError(f"invalid store key {key!r}")
    return "/".join(parts)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


class FileStore:
    """A directory on a local or mounted file system."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.uri = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / _clean_key(key)

    def put_bytes(self, key: str, data: bytes) -> None:
        atomic_write_bytes(self._path(key), data)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise NotFound(key) from None

    def put_file(self, key: str, local_path: str | Path) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        os.close(fd)
        try:
            shutil.copyfile(local_path, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(dest.parent)

    def get_file(self, key: str, local_path: str | Path) -> None:
        src = self._path(key)
        if not src.is_file():
            raise NotFound(key)
        Path(local_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, local_path)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = self.root / prefix.strip("/") if prefix.strip("/") else self.root
        # a prefix may end mid-name ("runs/a" matches "runs/abc/..."), like object stores
        start = base if base.is_dir() else base.parent
        if not start.is_dir():
            return []
        out = []
        for p in self._walk(start):
            key = p.relative_to(self.root).as_posix()
            if not key.startswith(prefix.lstrip("/")):
                continue
            st = p.stat()
            out.append(
                ObjectInfo(key, st.st_size, dt.datetime.fromtimestamp(st.st_mtime, dt.timezone.utc), "STANDARD")
            )
        return sorted(out, key=lambda o: o.key)

    def _walk(self, start: Path) -> Iterator[Path]:
        for dirpath, _dirs, files in os.walk(start):
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue  # an in-flight atomic write, not an object
                yield Path(dirpath) / name

    def delete(self, key: str) -> None:
        p = self._path(key)
        p.unlink(missing_ok=True)
        # prune empty parent directories up to the root
        parent = p.parent
        while parent != self.root and parent.is_dir():
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def local_path(self, key: str) -> Path | None:
        return self._path(key)


def open_store(uri: str) -> Store:
    """A Store for ``uri``: a plain path or file://, s3://, gs://, az://."""
    if "://" not in uri:
        return FileStore(uri)
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return FileStore(parsed.netloc + parsed.path if parsed.netloc not in ("", "localhost") else parsed.path)
    if parsed.scheme in ("s3", "gs", "az"):
        raise StoreError(
            f"store {uri!r}: the {parsed.scheme}:// backend is not available in this version; "
            "use a local path or file:// store"
        )
    raise StoreError(f"store {uri!r}: unsupported scheme {parsed.scheme!r}; use file://, s3://, gs:// or az://")


def join_key(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))
