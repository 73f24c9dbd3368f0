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
from typing import Literal, TypeAlias


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
