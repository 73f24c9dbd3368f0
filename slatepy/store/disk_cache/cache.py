"""A directory of cached object parts, shared by the processes of one machine.

Layout under the root (``disk_cache_dir``)::

    v1/tmp/<random>.tmp                   files being written (renamed into place when whole)
    v1/evict.lock                         held (flock) by the process that is evicting
    v1/<ns>/<hh>/<object>.p<size>-<i>     part i (bytes [i*size, (i+1)*size)) of an object
    v1/<ns>/<hh>/<object>.s<length>       the last <length> bytes of an object

``<ns>`` hashes the store's namespace (its URL and endpoint), ``<object>`` the object's path
and ``<hh>`` is the object hash's first byte, so no directory grows past a few thousand
files. The format of each file is in :mod:`slatepy.store.disk_cache.entry`.

Invariants, and what keeps them without any lock between readers and writers:

* A reader sees a whole file or none: a file is written under ``tmp/`` and renamed into
  place (``os.replace`` is atomic on one file system), never written where it is read.
* Two processes that cache the same part write identical bytes (objects are immutable), so
  the last rename winning is harmless.
* A file deleted while another process reads it is either already open (POSIX keeps the
  data until it is closed) or missing when opened: a miss, never an error.
* The size bound holds within ``max_bytes // 8`` per concurrently writing process: each
  process rescans the directory after writing that much, or as soon as its own estimate
  crosses the bound, and evicts the least recently used files down to 90 % of the bound.
  Recency is the file's mtime, set on every write and every hit.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import xxhash

from slatepy.store.disk_cache.entry import encode, read_data, read_header

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: evictions are not serialised
    fcntl = None  # type: ignore[assignment]

LAYOUT = "v1"
TMP = "tmp"
STALE_TMP_SECONDS = 3600.0
_DIR_MODE = 0o700
_FILE_MODE = 0o600
_PREFIX_MEMO = 4096


@dataclass(frozen=True, slots=True)
class EntryName:
    """One cacheable thing: a part or a suffix of an object in one store.

    Attributes:
        namespace: Which store: its URL plus whatever else tells stores apart (endpoint).
        path: The object's path in that store.
        tag: ``p<part size>-<index>`` for a part, ``s<length>`` for a suffix read.
    """

    namespace: str
    path: str
    tag: str

    @property
    def key(self) -> bytes:
        """What the file's header must hold for the file to count as this entry."""
        return f"{self.namespace}\0{self.path}\0{self.tag}".encode()


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes read from a cached entry, and how long the whole entry is.

    ``entry_len`` below the part size means the object ends inside this part.
    """

    data: bytes
    entry_len: int


@dataclass(frozen=True, slots=True)
class Evicted:
    """Files an eviction pass deleted."""

    files: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    """What a directory scan found."""

    files: int
    bytes: int


class DiskCache:
    """Cached parts of immutable objects under ``root``, bounded by ``max_bytes``.

    Thread-safe; several instances (in one process or many) may share one root. All I/O
    errors other than a missing file surface as ``OSError`` for the caller to count and
    fall back on the store; corrupt files surface as ``CorruptCacheEntry``.
    """

    _shared: dict[tuple[str, int], DiskCache] = {}  # noqa: RUF012 - one registry per process
    _shared_lock = threading.Lock()

    def __init__(self, root: str | Path, max_bytes: int) -> None:
        self.root = Path(root).expanduser()
        self.max_bytes = max_bytes
        self._base = str(self.root / LAYOUT)
        self._lock = threading.Lock()
        self._known: int | None = None  # bytes on disk at the last scan (None: not scanned)
        self._unscanned = 0  # bytes this instance wrote since that scan
        self._prefixes: dict[tuple[str, str], str] = {}

    @classmethod
    def shared(cls, root: str | Path, max_bytes: int) -> DiskCache:
        """The process's one instance for ``root`` and ``max_bytes`` (its accounting shared)."""
        key = (str(Path(root).expanduser().resolve()), max_bytes)
        with cls._shared_lock:
            cache = cls._shared.get(key)
            if cache is None:
                cache = cls._shared[key] = cls(root, max_bytes)
            return cache

    def file_of(self, name: EntryName) -> str:
        """Where ``name`` is cached."""
        return f"{self._object_prefix(name.namespace, name.path)}.{name.tag}"

    def _object_prefix(self, namespace: str, path: str) -> str:
        # Memoised: a warm read is a few system calls, and hashing and joining the path each
        # time cost as much as they do.
        key = (namespace, path)
        prefix = self._prefixes.get(key)
        if prefix is None:
            if len(self._prefixes) >= _PREFIX_MEMO:
                self._prefixes.clear()
            ns = xxhash.xxh3_64_hexdigest(namespace.encode())
            obj = xxhash.xxh3_128_hexdigest(path.encode())
            prefix = self._prefixes[key] = os.path.join(self._base, ns, obj[:2], obj)
        return prefix

    def read(self, name: EntryName, lo: int, hi: int) -> Piece | None:
        """Bytes ``[lo, hi)`` of the cached entry (clipped to its length), or None if absent.

        Marks the entry as recently used.

        Raises:
            CorruptCacheEntry: the file failed verification; call :meth:`discard`.
            OSError: the file could not be read.
        """
        try:
            fd = os.open(self.file_of(name), os.O_RDONLY)
        except FileNotFoundError:
            return None  # never cached, or evicted by any process: a miss
        try:
            header = read_header(fd, name.key, os.fstat(fd).st_size)
            data = read_data(fd, header, lo, hi)
            now = time.time_ns()
            os.utime(fd, ns=(now, now))
            return Piece(data, header.data_len)
        finally:
            os.close(fd)

    def write(self, name: EntryName, data: bytes) -> Evicted:
        """Cache ``data`` as ``name`` (atomically), then evict if the bound is crossed.

        Raises:
            OSError: the file could not be written (it is then absent, never partial).
        """
        pieces = encode(name.key, data)
        size = sum(len(p) for p in pieces)
        target = self.file_of(name)
        tmp = os.path.join(self._base, TMP, f"{uuid.uuid4().hex}.tmp")
        try:
            self._write_file(tmp, pieces)
        except FileNotFoundError:
            _make_dirs(os.path.dirname(tmp))
            self._write_file(tmp, pieces)
        try:
            try:
                os.replace(tmp, target)
            except FileNotFoundError:
                _make_dirs(os.path.dirname(target))
                os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return self._account(size)

    def discard(self, name: EntryName) -> None:
        """Delete the entry (a corrupt file); a missing file is fine."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.file_of(name))

    def forget(self, namespace: str, path: str) -> int:
        """Delete every entry of one object (it was deleted from the store); returns how many."""
        directory, stem = os.path.split(self._object_prefix(namespace, path) + ".")
        removed = 0
        try:
            with os.scandir(directory) as entries:
                doomed = [e.path for e in entries if e.name.startswith(stem)]
        except FileNotFoundError:
            return 0
        for file_path in doomed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(file_path)
                removed += 1
        return removed

    def usage(self) -> Usage:
        """Files and bytes in the cache now (one directory scan)."""
        files = list(self._scan())
        return Usage(len(files), sum(size for _, size, _ in files))

    def evict(self) -> Evicted:
        """Scan the directory and, if over the bound, delete least recently used files.

        Skipped (returns nothing evicted) while another process holds the eviction lock: it
        is bringing the size down already.
        """
        with self._lock, self._eviction_lock() as held:
            if not held:
                return Evicted()
            files = list(self._scan())
            total = sum(size for _, size, _ in files)
            evicted = Evicted()
            if total > self.max_bytes:
                goal = self.max_bytes - self.max_bytes // 10
                files.sort()  # oldest mtime first
                count = freed = 0
                for _, size, path in files:
                    if total - freed <= goal:
                        break
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                        count += 1
                    freed += size  # gone either way: ours or another evicter's
                evicted = Evicted(count, freed)
                total -= freed
            self._known, self._unscanned = total, 0
            return evicted

    def _account(self, size: int) -> Evicted:
        with self._lock:
            self._unscanned += size
            due = (
                self._known is None
                or self._known + self._unscanned > self.max_bytes
                or self._unscanned > self.max_bytes // 8
            )
        return self.evict() if due else Evicted()

    @contextlib.contextmanager
    def _eviction_lock(self) -> Iterator[bool]:
        if fcntl is None:
            yield True
            return
        _make_dirs(self._base)
        fd = os.open(os.path.join(self._base, "evict.lock"), os.O_RDWR | os.O_CREAT, _FILE_MODE)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the lock

    def _scan(self) -> Iterator[tuple[int, int, str]]:
        """``(mtime_ns, size, path)`` of every cached file; stale temporaries are removed."""
        try:
            namespaces = list(os.scandir(self._base))
        except FileNotFoundError:
            return
        stale = time.time_ns() - int(STALE_TMP_SECONDS * 1e9)
        for ns in namespaces:
            if not ns.is_dir(follow_symlinks=False):
                continue
            for entry in _walk_files(ns.path):
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # evicted or renamed meanwhile
                if ns.name == TMP:
                    if st.st_mtime_ns < stale:  # left by a process that died mid-write
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.path)
                    continue
                yield st.st_mtime_ns, st.st_size, entry.path

    @staticmethod
    def _write_file(path: str, pieces: list[bytes]) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        try:
            for piece in pieces:
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view) :]
            now = time.time_ns()
            os.utime(fd, ns=(now, now))
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        os.close(fd)


def _walk_files(top: str) -> Iterator[os.DirEntry[str]]:
    """Files under ``top`` (two levels at most: namespace/shard/file)."""
    try:
        with os.scandir(top) as entries:
            children = list(entries)
    except FileNotFoundError:
        return
    for child in children:
        if child.is_dir(follow_symlinks=False):
            yield from _walk_files(child.path)
        elif child.is_file(follow_symlinks=False):
            yield child


def _make_dirs(path: str | Path) -> None:
    os.makedirs(path, mode=_DIR_MODE, exist_ok=True)
