"""FileStore: a directory on a local or mounted file system, with an ``archive/`` area as its cold tier."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from thrifty.storage.atomic import atomic_write_bytes, fsync_dir, replace_atomically, sweep_dir, write_atomically
from thrifty.storage.base import Archived, Conflict, NotFound, ObjectInfo, RestoreStatus, StoreError, _clean_key
from thrifty.storage.retry import DEFAULT_RETRY_S, disk_errors_named, retried

FILE_ARCHIVE_AREA = "archive"  # a file store's cold tier: <root>/archive/<key>; keys may not start with it
FILE_ARCHIVE_CLASS = "ARCHIVE"


@retried
class FileStore:
    """A directory on a local or mounted file system.

    Its cold tier is an ``archive/`` area beside the objects: an archived object moves (one atomic
    rename) to ``<root>/archive/<key>``, still lists under its key with storage class ARCHIVE, and
    reads fail with Archived until it is restored, as on the object stores. A mounted file system's
    stalls (EIO, ETIMEDOUT, ESTALE) are retried like an object store's outage; a full or read-only disk
    is named as such (``thrifty.storage.retry``).
    """

    _disk_is = "the store's disk"

    def __init__(self, root: str | Path, retry_s: float = DEFAULT_RETRY_S):
        self.retry_s = retry_s
        self.root = Path(root).expanduser().resolve()
        self.uri = f"file://{self.root}"
        self._archive = self.root / FILE_ARCHIVE_AREA
        self._check_root()

    def _check_root(self) -> None:
        """A root that can never be a directory of files is refused when the store is opened, before anything is
        written: a file (/dev/null), a place under a file, or the kernel's own file systems (/proc, /sys)."""
        if self.root.parts[1:2] in (("proc",), ("sys",)):
            raise StoreError(f"store {self.uri!r} cannot be used: it is inside /{self.root.parts[1]}, a kernel file "
                             "system that holds no files of ours; pick another 'store' (a directory)")
        try:
            existing = next(p for p in (self.root, *self.root.parents) if os.path.lexists(p))
            is_dir = existing.is_dir()
        except OSError as exc:
            raise StoreError(f"store {self.uri!r} cannot be used ({exc.strerror}); pick another 'store'") from None
        if not is_dir:
            raise StoreError(f"store {self.uri!r} cannot be created: {existing} is not a directory; pick another "
                             "'store' (a directory)")

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

    def _transient(self, exc: BaseException) -> bool:
        return False  # beyond what thrifty.storage.retry takes for transient on any store (EIO, ETIMEDOUT, ...)

    @contextlib.contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        """Written straight beside its target (one copy), renamed into place when the block ends."""
        with disk_errors_named(self.uri, "write", key), write_atomically(self._path(key)) as f:
            yield f
        self._dropped_archived_copy(key)

    def sweep(self, prefix: str = "") -> int:
        top = self.root / prefix.strip("/") if prefix.strip("/") else self.root
        return sweep_dir(top) if top.is_dir() and top.is_relative_to(self.root) else 0

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
        if ".." in prefix.split("/"):  # keys never hold '..': a prefix with it could only list outside the store
            raise StoreError(f"store {self.uri!r}: invalid prefix {prefix[:200]!r} ('..' is not part of any key)")
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
                if name.startswith(".") and name.endswith((".tmp", ".lock")):
                    continue  # an in-flight atomic write or a conditional write's lock, not an object
                p = Path(dirpath) / name
                key = p.relative_to(area).as_posix()
                if key.startswith(prefix) and not (area == self.root and key.startswith(FILE_ARCHIVE_AREA + "/")):
                    try:
                        st = p.stat()
                    except FileNotFoundError:  # deleted while we walked (pruning, archival): not there any more
                        continue
                    yield key, st

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

    # ------------------------------------------------------------- conditional writes
    # The version token is the SHA-256 of the content. Not mtime_ns+inode+size: an inode number is reused as
    # soon as a replaced file is freed, and mtimes advance in clock ticks (milliseconds on many file systems), so
    # two writes of the same size within one tick could share that token with different content, and a stale
    # compare-and-swap would win. A content hash cannot be fooled that way across processes or hosts; identical
    # bytes share a token, which compares content (see Store). Create-only is one os.link of a complete temp file
    # (atomic, and it fails if the name exists); compare-and-swap and delete_if hold an exclusive flock on a
    # sidecar ``.<name>.lock`` around read, compare and replace. Both need a file system that honours them across
    # its clients (local ones and NFSv4 do; some FUSE mounts do not).

    @staticmethod
    def _version(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def get_bytes_versioned(self, key: str) -> tuple[bytes, str]:
        data = self.get_bytes(key)  # one read of a file that writers replace whole: bytes and hash agree
        return data, self._version(data)

    def put_bytes_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        path = self._path(key)
        if expected is None:
            if self._archived_path(key).is_file():  # an archived object exists too, as on the object stores
                raise Conflict(f"store {self.uri!r}: {key} already exists (archived)")
            self._create_only(path, key, data)
        else:
            try:
                with self._locked(path):
                    self._expect(path, key, expected)
                    atomic_write_bytes(path, data)
            except Conflict:
                self._prune_dirs(path.parent, self.root)  # the lock's directories, if the object never was
                raise
            self._dropped_archived_copy(key)
        return self._version(data)

    def delete_if(self, key: str, *, expected: str) -> None:
        path = self._path(key)
        try:
            with self._locked(path):
                self._expect(path, key, expected)
                path.unlink()
            fsync_dir(path.parent)
        finally:
            self._prune_dirs(path.parent, self.root)

    def _expect(self, path: Path, key: str, expected: str) -> None:
        try:
            current = self._version(path.read_bytes())
        except (FileNotFoundError, IsADirectoryError):
            raise Conflict(f"store {self.uri!r}: {key} is gone (expected version {expected[:12]})") from None
        if current != expected:
            raise Conflict(f"store {self.uri!r}: {key} changed (expected version {expected[:12]}, found "
                           f"{current[:12]})")

    def _create_only(self, path: Path, key: str, data: bytes) -> None:
        for _ in range(10):  # a concurrent delete may prune the directory between mkdir and the temp file
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
            except FileNotFoundError:
                continue
            break
        else:
            raise StoreError(f"store {self.uri!r}: cannot create {path.parent} for {key}")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # atomic: the name appears complete, or the call fails because it exists
            except FileExistsError:
                raise Conflict(f"store {self.uri!r}: {key} already exists") from None
        finally:
            Path(tmp).unlink(missing_ok=True)
        fsync_dir(path.parent)

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        """Hold an exclusive flock on ``.<name>.lock`` beside ``path``; the holder removes the file when done.

        A process that waited on the lock then finds it holds a file no longer at that name (or another file
        there): it starts again, so one holder at a time holds the file that is at the name, and none is left over.
        """
        lock = path.parent / f".{path.name}.lock"
        while True:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # the directory was pruned in between
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    same = os.path.samestat(os.fstat(fd), os.stat(lock))
                except FileNotFoundError:
                    same = False
                if not same:
                    continue  # the previous holder removed it while we waited
                try:
                    yield
                finally:
                    lock.unlink(missing_ok=True)  # before unlocking: a waiter then sees it is gone
                return
            finally:
                os.close(fd)  # releases the flock

    def local_path(self, key: str) -> Path | None:
        return self._path(key)
