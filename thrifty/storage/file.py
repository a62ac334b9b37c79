"""FileStore: a directory on a local or mounted file system, with an ``archive/`` area as its cold tier."""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path
from typing import Iterator

from thrifty.storage.atomic import atomic_write_bytes, fsync_dir, replace_atomically
from thrifty.storage.base import Archived, NotFound, ObjectInfo, RestoreStatus, StoreError, _clean_key

FILE_ARCHIVE_AREA = "archive"  # a file store's cold tier: <root>/archive/<key>; keys may not start with it
FILE_ARCHIVE_CLASS = "ARCHIVE"


class FileStore:
    """A directory on a local or mounted file system.

    Its cold tier is an ``archive/`` area beside the objects: an archived object moves (one atomic
    rename) to ``<root>/archive/<key>``, still lists under its key with storage class ARCHIVE, and
    reads fail with Archived until it is restored, as on the object stores.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.uri = f"file://{self.root}"
        self._archive = self.root / FILE_ARCHIVE_AREA

    def _path(self, key: str) -> Path:
        key = _clean_key(key)
        if key.split("/", 1)[0] == FILE_ARCHIVE_AREA:
            raise StoreError(f"store {self.uri!r}: keys under {FILE_ARCHIVE_AREA}/ are reserved for archived objects")
        return self.root / key

    def _archived_path(self, key: str) -> Path:
        return self._archive / _clean_key(key)

    def _archived_error(self, key: str) -> Archived:
        return Archived(f"store {self.uri!r}: {key} is archived (in {self._archive}); restore it first "
                        "(thrifty archive restore RUN_ID, or Store.restore)")

    def _dropped_archived_copy(self, key: str) -> None:
        """A new write supersedes an archived copy: remove it so a restore never brings back old bytes."""
        old = self._archived_path(key)
        if old.exists():
            old.unlink()
            self._prune_dirs(old.parent, self._archive)

    def put_bytes(self, key: str, data: bytes) -> None:
        atomic_write_bytes(self._path(key), data)
        self._dropped_archived_copy(key)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            if self._archived_path(key).is_file():
                raise self._archived_error(key) from None
            raise NotFound(key) from None

    def put_file(self, key: str, local_path: str | Path) -> None:
        replace_atomically(self._path(key), lambda tmp: shutil.copyfile(local_path, tmp))
        self._dropped_archived_copy(key)

    def get_file(self, key: str, local_path: str | Path) -> None:
        src = self._path(key)
        if not src.is_file():
            if self._archived_path(key).is_file():
                raise self._archived_error(key)
            raise NotFound(key)
        Path(local_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, local_path)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file() or self._archived_path(key).is_file()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        prefix = prefix.lstrip("/")
        found: dict[str, ObjectInfo] = {}
        for area, storage_class in ((self._archive, FILE_ARCHIVE_CLASS), (self.root, "STANDARD")):
            for key, st in self._walk(area, prefix):
                # hot wins over an archived copy (only a crash inside a write leaves both)
                found[key] = ObjectInfo(key, st.st_size, dt.datetime.fromtimestamp(st.st_mtime, dt.timezone.utc),
                                        storage_class)
        return sorted(found.values(), key=lambda o: o.key)

    def _walk(self, area: Path, prefix: str) -> Iterator[tuple[str, os.stat_result]]:
        base = area / prefix.strip("/") if prefix.strip("/") else area
        # a prefix may end mid-name ("runs/a" matches "runs/abc/..."), like object stores
        start = base if base.is_dir() else base.parent
        if not start.is_dir() or not start.is_relative_to(area):
            return
        for dirpath, dirs, files in os.walk(start):
            if Path(dirpath) == self.root and area == self.root and FILE_ARCHIVE_AREA in dirs:
                dirs.remove(FILE_ARCHIVE_AREA)  # the archive area is walked on its own
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue  # an in-flight atomic write, not an object
                p = Path(dirpath) / name
                key = p.relative_to(area).as_posix()
                if key.startswith(prefix) and not (area == self.root and key.startswith(FILE_ARCHIVE_AREA + "/")):
                    yield key, p.stat()

    def delete(self, key: str) -> None:
        p = self._path(key)
        p.unlink(missing_ok=True)
        self._prune_dirs(p.parent, self.root)
        self._dropped_archived_copy(key)

    @staticmethod
    def _prune_dirs(parent: Path, top: Path) -> None:
        """Remove empty directories from ``parent`` up to (not including) ``top``."""
        while parent != top and parent.is_dir() and parent.is_relative_to(top):
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def _move(self, src: Path, dest: Path, top: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dest)  # one rename: the object is in one place or the other, never both or neither
        fsync_dir(dest.parent)
        fsync_dir(src.parent)
        self._prune_dirs(src.parent, top)

    def set_storage_class(self, key: str, storage_class: str) -> None:
        hot, cold = self._path(key), self._archived_path(key)
        if storage_class.upper() == FILE_ARCHIVE_CLASS:
            if hot.is_file():
                self._move(hot, cold, self.root)
            elif not cold.is_file():
                raise NotFound(key)
        elif storage_class.upper() == "STANDARD":
            if hot.is_file():
                self._dropped_archived_copy(key)  # a hot write newer than a leftover archived copy wins
            elif cold.is_file():
                self._move(cold, hot, self._archive)
            else:
                raise NotFound(key)
        else:
            raise StoreError(f"store {self.uri!r}: a file store has two storage classes, STANDARD and "
                             f"{FILE_ARCHIVE_CLASS} (its {FILE_ARCHIVE_AREA}/ area), not {storage_class!r}; "
                             "other cold tiers need an s3://, gs:// or az:// store")

    def restore(self, key: str, *, priority: str = "standard", days: int = 7) -> RestoreStatus:
        self.set_storage_class(key, "STANDARD")
        return RestoreStatus(key, "done", "immediate (a local move)")

    def local_path(self, key: str) -> Path | None:
        return self._path(key)
