"""The object-store interface every layer above talks to.

An ``ObjectStore`` is a flat namespace of immutable-or-overwritable objects addressed by
``/``-separated paths relative to the store's root. Implementations translate their
backend's failures into :mod:`slatepy.errors` (``NotFound``, ``AlreadyExists``,
``PreconditionFailed``, ``StoreUnavailable`` with ``definite``); nothing above this layer
ever sees an ``obstore`` exception.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal, TypeAlias

if TYPE_CHECKING:
    from slatepy.store.local_read import KeptReads


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What a listing or a HEAD says about one object."""

    path: str
    size: int
    last_modified: datetime
    e_tag: str | None


@dataclass(frozen=True, slots=True)
class IfMatch:
    """Put mode: replace the object only if its current ETag is ``e_tag``."""

    e_tag: str


PutMode: TypeAlias = Literal["overwrite", "create"] | IfMatch

PutData: TypeAlias = bytes | bytearray
"""What a put writes: a bytearray too, so a large SST built in one buffer is written
without first being copied into a ``bytes``."""
"""``overwrite`` always writes; ``create`` fails with ``AlreadyExists`` if the path is taken;
``IfMatch`` fails with ``PreconditionFailed`` unless the current ETag matches."""


class ObjectWriter(abc.ABC):
    """One object written as a stream of parts (``ObjectStore.open_writer``), so a writer of
    a large object holds about one part in memory, not the whole object.

    Nothing is visible at the path until :meth:`commit` returns; :meth:`abort` (also after a
    failed ``write`` or ``commit``) discards what was sent. The write overwrites: a streamed
    upload cannot be conditional on every backend, so callers write only fresh, unique paths
    this way (compaction outputs under random ids).
    """

    @abc.abstractmethod
    def write(self, data: PutData) -> None:
        """Append ``data`` to the object (sent once a part's worth is buffered)."""

    @abc.abstractmethod
    def commit(self) -> None:
        """Send what is buffered and make the object visible (and, on ``file://``, durable)."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Discard the object; idempotent, and safe after a failure or a commit."""

    @property
    @abc.abstractmethod
    def requests(self) -> int:
        """Requests the committed upload took (what the store bills), for the metrics."""


class BufferedWriter(ObjectWriter):
    """The fallback ``ObjectWriter``: buffers the whole object and writes it with one
    ``put`` on commit. Every wrapper that does not stream (fault injectors, test doubles)
    gets this, so its ``put`` sees the write as it always did."""

    def __init__(self, store: ObjectStore, path: str) -> None:
        self._store = store
        self._path = path
        self._data: bytearray | None = bytearray()

    def write(self, data: PutData) -> None:
        if self._data is None:
            raise ValueError(f"write to {self._path} after commit or abort")
        self._data += data

    def commit(self) -> None:
        if self._data is None:
            raise ValueError(f"commit of {self._path} after commit or abort")
        self._store.put(self._path, self._data)
        self._data = None

    def abort(self) -> None:
        self._data = None

    @property
    def requests(self) -> int:
        return 1


class ObjectStore(abc.ABC):
    """Abstract object store; see the module docstring for the error contract."""

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """A URL naming this store (credentials never included)."""

    @property
    def supports_if_match(self) -> bool:
        """Whether ``put(mode=IfMatch(...))`` is atomic on this backend."""
        return True

    @property
    def supports_suffix(self) -> bool:
        """Whether ``get_suffix`` is one request on this backend.

        Where it is not (Azure Blob has no suffix ranges), ``get_suffix`` still works but
        costs a HEAD for the size and then a range GET, so a caller that already knows the
        object's size (a listing, a manifest) should call ``get_range`` instead.
        """
        return True

    @abc.abstractmethod
    def get(self, path: str) -> bytes:
        """Return the whole object. Raises ``NotFound``."""

    @abc.abstractmethod
    def get_range(self, path: str, start: int, end: int) -> bytes:
        """Return bytes ``[start, end)``; shorter if the object ends first."""

    @abc.abstractmethod
    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Return several ``[start, end)`` ranges of one object (coalesced where useful)."""

    @abc.abstractmethod
    def get_suffix(self, path: str, length: int) -> bytes:
        """Return the last ``length`` bytes (the whole object if it is shorter)."""

    @abc.abstractmethod
    def head(self, path: str) -> ObjectMeta:
        """Return the object's metadata. Raises ``NotFound``."""

    @abc.abstractmethod
    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        """Write ``data`` atomically at ``path``; return the new ETag if the store gives one."""

    @abc.abstractmethod
    def delete(self, path: str) -> None:
        """Delete ``path``; deleting a missing object succeeds (idempotent)."""

    @abc.abstractmethod
    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        """List objects under ``prefix`` (paths > ``offset`` if given), sorted by path."""

    @abc.abstractmethod
    def copy(self, source: str, destination: str) -> None:
        """Copy ``source`` to ``destination``, overwriting it."""

    def open_writer(self, path: str) -> ObjectWriter:
        """Start a streamed write of ``path`` (overwrite; see :class:`ObjectWriter`).

        Here the object is buffered and written with one ``put`` on commit; the backend store
        streams it as a multipart upload, and the wrappers that do not change writes pass
        the stream through.
        """
        return BufferedWriter(self, path)

    def recover(self) -> int:
        """Finish writes a crashed process left half done; returns how many.

        Stores with native conditional writes have none; the two-phase CAS store does.
        """
        return 0

    def drain(self) -> None:
        """Wait for work this store finishes in the background (two-phase completions).

        Called on close, so a closed database leaves nothing half done that it started.
        Stores that do all their work in the request itself have nothing to wait for.
        """
        return None

    def kept_reads(self, path: str) -> KeptReads | None:
        """A shortcut for reads of the immutable object ``path`` that skips this stack's
        Python layers (one ``pread`` of a kept descriptor, counted as the stack would count
        it; see :class:`~slatepy.store.local_read.KeptReads`), or None: read through the
        stack. Only a layer that knows the shortcut keeps what it does answers (a counting,
        retrying or routing layer); any other store or wrapper (a remote store, a disk
        cache, a test's fault injector) says None, so its reads still pass through it."""
        return None


class WrappingStore(ObjectStore):
    """Forwards every operation to ``inner``; wrappers override only what they change."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def supports_if_match(self) -> bool:
        return self.inner.supports_if_match

    @property
    def supports_suffix(self) -> bool:
        return self.inner.supports_suffix

    def get(self, path: str) -> bytes:
        return self.inner.get(path)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        return self.inner.get_range(path, start, end)

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return self.inner.get_ranges(path, ranges)

    def get_suffix(self, path: str, length: int) -> bytes:
        return self.inner.get_suffix(path, length)

    def head(self, path: str) -> ObjectMeta:
        return self.inner.head(path)

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        return self.inner.put(path, data, mode=mode)

    def delete(self, path: str) -> None:
        self.inner.delete(path)

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        return self.inner.list(prefix, offset=offset)

    def copy(self, source: str, destination: str) -> None:
        self.inner.copy(source, destination)

    def recover(self) -> int:
        return self.inner.recover()

    def drain(self) -> None:
        self.inner.drain()
