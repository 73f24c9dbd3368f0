"""Reads of a ``file://`` store straight from the files, without obstore's runtime hop.

obstore's ``LocalStore`` costs about 87 µs per ranged read on this machine (a request through
its async runtime); ``os.pread`` on the same file costs 2-11 µs. A point lookup that misses
the block cache is one such read, so on ``file://`` the hop, not the disk, bounded random
gets (issue 18). Writes, listings and HEADs still go through obstore, which owns the
temporary-file and link/rename protocol that makes creates atomic; reads only need the
file at its final name, which obstore creates whole.

Compacted SSTs are never rewritten (their names are random ids), so their descriptors are
kept open, a bounded number of them in LRU order: a point get that misses the block cache is
then one ``pread``, without an ``open``/``fstat``/``close`` around it, nor a lock (see
:class:`LocalReads`). A descriptor of an SST
that GC deleted still reads its old bytes, which is what the reader holding it expects, and
holds the file's disk space until it is evicted.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from slatepy.errors import InvalidArgument, NotFound, StoreUnavailable

IMMUTABLE_PREFIX = "compacted/"
"""Objects under this prefix are written once and never replaced: their descriptors may be
kept open."""

MAX_OPEN = 64
"""Descriptors of immutable objects kept open (least recently used closed first)."""

_os_pread = os.pread  # (a module global: one lookup less on every cold get)


class _Handle:
    """An open descriptor and the object's size; the descriptor is closed when the last
    reference to the handle goes (CPython frees it then): once it is evicted, and no read
    that took it from the table is still using it."""

    __slots__ = ("__weakref__", "fd", "size")

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        weakref.finalize(self, os.close, fd)


class LocalReads:
    """Reads objects of a ``LocalStore`` rooted at ``root`` directly from its files.

    Thread-safe. A read of a kept descriptor takes no lock: it looks the handle up (one
    dict operation, atomic) and holds a reference to it while it reads, so an eviction by
    another thread meanwhile only drops the table's reference and the descriptor closes
    after the read (see :class:`_Handle`). Opening, inserting and evicting are serialised
    by a lock.
    """

    def __init__(self, root: str, url: str, *, max_open: int = MAX_OPEN) -> None:
        self._root = os.path.abspath(root)
        self._url = url
        self._max_open = max_open
        self._handles: OrderedDict[str, _Handle] = OrderedDict()
        self._lock = threading.Lock()

    def kept_reads(self, path: str) -> KeptReads | None:
        """One-``pread`` reads of ``path``'s kept descriptor (:class:`KeptReads`), for an
        immutable object; None for others (each read opens the file)."""
        return KeptReads(self) if path.startswith(IMMUTABLE_PREFIX) else None

    def close(self) -> None:
        """Drop the kept descriptors: each closes now, or when the read using it ends."""
        with self._lock:
            self._handles.clear()

    def _handle(self, path: str) -> _Handle:
        """A kept descriptor of the immutable object at ``path``, opened on first use."""
        handle = self._handles.get(path)
        if handle is not None:
            # Not contextlib.suppress: this is every read's path, and a ``with`` costs more.
            try:  # noqa: SIM105
                self._handles.move_to_end(path)
            except KeyError:
                pass  # evicted by another thread since the lookup: this read still has it
            return handle
        fd = self._open(path)
        try:
            size = os.fstat(fd).st_size
        except OSError as exc:
            os.close(fd)
            raise StoreUnavailable(f"reading {path} on {self._url}: {exc}", path=path) from exc
        handle = _Handle(fd, size)
        with self._lock:
            kept = self._handles.get(path)
            if kept is not None:  # another thread opened it meanwhile: use theirs (ours closes)
                return kept
            self._handles[path] = handle
            while len(self._handles) > self._max_open:
                self._handles.popitem(last=False)
        return handle

    def _open(self, path: str) -> int:
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise InvalidArgument(f"not an object path: {path!r}")
        try:
            return os.open(os.path.join(self._root, *parts), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFound(f"object not found: {path} on {self._url}", path=path) from None
        except OSError as exc:
            raise StoreUnavailable(f"reading {path} on {self._url}: {exc}", path=path) from exc

    def get(self, path: str) -> bytes:
        fd = self._open(path)
        try:
            return _read(fd, 0, os.fstat(fd).st_size, path)
        finally:
            os.close(fd)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        """One non-empty byte range ``[start, end)``; see :meth:`get_ranges`. A point get
        that misses the block cache is one of these: a kept descriptor's is one ``pread``."""
        handle = self._handles.get(path)
        if handle is None:
            return self.get_ranges(path, [(start, end)])[0]
        try:  # noqa: SIM105 (as in _handle)
            self._handles.move_to_end(path)
        except KeyError:
            pass  # evicted since the lookup: the reference held here keeps it open
        size = handle.size
        if not 0 <= start < size:
            raise self._outside(path, start, size)
        end = min(end, size)
        data = _pread(handle.fd, end - start, start, path)
        return data if len(data) == end - start else _read(handle.fd, start, end, path)

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Byte ranges ``[start, end)`` (non-empty), as a ranged GET answers them: a range that
        runs past the end is cut short; one that starts at or past the end is an error.

        Raises:
            NotFound: no such object.
            StoreUnavailable: a range starts outside the object (``definite``: nothing read).
        """
        if path.startswith(IMMUTABLE_PREFIX):
            handle = self._handle(path)
            return self._read_ranges(path, handle.fd, handle.size, ranges)
        fd = self._open(path)
        try:
            return self._read_ranges(path, fd, os.fstat(fd).st_size, ranges)
        finally:
            os.close(fd)

    def _read_ranges(
        self, path: str, fd: int, size: int, ranges: Sequence[tuple[int, int]]
    ) -> list[bytes]:
        for start, _ in ranges:
            if not 0 <= start < size:
                raise self._outside(path, start, size)
        return [_read(fd, start, min(end, size), path) for start, end in ranges]

    def _outside(self, path: str, start: int, size: int) -> StoreUnavailable:
        return StoreUnavailable(
            f"range from {start} of {path} on {self._url} starts outside the object ({size} bytes)",
            path=path,
        )

    def get_suffix(self, path: str, length: int) -> bytes:
        fd = self._open(path)
        try:
            size = os.fstat(fd).st_size
            return _read(fd, max(0, size - max(length, 0)), size, path)
        finally:
            os.close(fd)


class ReadCounter(Protocol):
    """Where :class:`KeptReads` counts (a :class:`~slatepy.store.metrics.StoreMetrics`;
    named structurally, so this module needs nothing of the stack above it)."""

    def record_reads(self, kind: str, requests: int, received: int) -> None: ...


class KeptReads:
    """Reads of immutable objects of one :class:`LocalReads` with one ``pread`` of a kept
    descriptor and nothing else: what a table reader's point get that misses the block cache
    reads (issue 33: through the layers of a store stack, each a Python call, the read cost
    several times its ``pread``).

    Only the plain success is served here: an object whose descriptor is not kept (not read
    yet, or evicted), a range not wholly inside the object, a short read or any ``OSError``
    answer None, and the caller reads through the store stack, which opens, maps errors to
    ``NotFound``/``StoreUnavailable`` naming the object, retries and counts. So the layers
    a shortcut skips are only those that do nothing to a successful read but count it: the
    counting is done here, in the ``metrics`` of the :class:`~slatepy.store.metrics.MetricsStore`
    that handed this out (one ``get_range`` and its bytes, as it counts a read it passes).
    Obtain one from the stack (``ObjectStore.kept_reads``), never directly: a layer that
    does more than count, retry or route (a disk cache, a fault injector) answers None.
    """

    __slots__ = ("_handles", "_metrics")

    def __init__(self, local: LocalReads, metrics: ReadCounter | None = None) -> None:
        self._handles = local._handles
        self._metrics = metrics

    def counted(self, metrics: ReadCounter) -> KeptReads | None:
        """These reads, counted in ``metrics`` (None if already counted elsewhere: two
        counting layers are left to the stack)."""
        if self._metrics is not None:
            return None
        kept = KeptReads.__new__(KeptReads)
        kept._handles, kept._metrics = self._handles, metrics
        return kept

    def read(self, path: str, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` of ``path`` (``start < end``), or None: read it through the
        stack (see the class)."""
        handles = self._handles
        handle = handles.get(path)
        if handle is None:
            return None
        try:  # noqa: SIM105 (as in LocalReads._handle)
            handles.move_to_end(path)
        except KeyError:
            pass  # evicted since the lookup: the reference held here keeps it open
        length = end - start
        if not 0 <= start < end <= handle.size:
            return None
        try:
            data = _os_pread(handle.fd, length, start)
        except OSError:
            return None
        if len(data) != length:
            return None  # the file shrank under the descriptor: the stack says so, typed
        metrics = self._metrics
        if metrics is not None:
            metrics.record_reads("get_range", 1, length)
        return data


def _read(fd: int, start: int, end: int, path: str) -> bytes:
    """``end - start`` bytes from ``start`` (pread may return less than asked: loop)."""
    chunks: list[bytes] = []
    offset = start
    while offset < end:
        chunk = _pread(fd, end - offset, offset, path)
        if not chunk:
            raise StoreUnavailable(f"{path} shrank while it was read", path=path)
        chunks.append(chunk)
        offset += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _pread(fd: int, length: int, offset: int, path: str) -> bytes:
    """``os.pread``, its failures typed: a directory is no object (``NotFound``, as a GET of
    it answers); any other (EIO, ...) is ``StoreUnavailable``, which the stack retries."""
    try:
        return os.pread(fd, length, offset)
    except IsADirectoryError:
        raise NotFound(f"object not found: {path} (a directory)", path=path) from None
    except OSError as exc:
        raise StoreUnavailable(f"reading {path}: {exc}", path=path) from exc
