"""The read and write calls every handle shares, written once over a few hooks.

``Db``, ``DbReader`` and ``Snapshot`` each know how to take one consistent view
(:meth:`ReadSurface._view_for`) and the newest version of one key
(:meth:`ReadSurface._version`); everything here (iterators, reverse and limited scans,
prefix scans, batched scans, ``get``, ``get_key_value``, the mapping protocol) is built on
those two, so the handles cannot drift apart (RFC 0020). ``Db`` keeps a faster ``get``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, Self

from slatepy.engine.batch import WriteBatch, check_key, check_range
from slatepy.engine.columns import Rows
from slatepy.engine.iterator import (
    DEFAULT_BATCH_SIZE,
    BatchFormat,
    DbIterator,
    View,
    check_limit,
    key_bounds,
    limited,
    rows_or_batches,
)
from slatepy.engine.memtable import Memtable, Version
from slatepy.engine.view import get_compacted, newer_version, scan_merged
from slatepy.errors import InvalidType
from slatepy.manifest.record import Manifest
from slatepy.store.base import ObjectStore
from slatepy.table.reader import TableReader
from slatepy.table.visibility import frozen_clock, live_expiring


class KeyValue(NamedTuple):
    """A key's live value and the sequence number of the write that set it."""

    key: bytes
    value: bytes
    seq: int


def version_in(
    memtable: Memtable, tables: TableReader, view: Manifest, key: bytes
) -> Version | None:
    """The newest version of ``key`` in ``memtable`` over ``view``'s SSTs (see ``Db.get``)."""
    version = memtable.get(key)
    if version is not None and version[0] > view.last_ingest_seq:
        return version
    return newer_version(version, get_compacted(tables, view, key))


def as_url(url: str | os.PathLike[str] | ObjectStore) -> str | ObjectStore:
    """A ``pathlib.Path`` (or any path-like) as its ``file://`` URL; anything else as given."""
    if isinstance(url, os.PathLike):
        return Path(url).resolve().as_uri()
    return url


def _keeping(view: View, rows: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
    """``rows``, keeping ``view`` referenced while they are read: a writer's collector
    spares the SSTs of the views still referenced (RFC 0029). Column rows keep it as an
    attribute, so no Python frame runs per row."""
    if isinstance(rows, Rows):
        rows.keep = view
        return rows
    return _yielding(view, rows)


def _yielding(view: View, rows: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
    yield from rows


def _expiring(view: View, lo: bytes, hi: bytes | None) -> Iterator[tuple[bytes, bytes, int | None]]:
    """The rows of :meth:`ReadSurface.items_with_expiry` read from ``view``."""
    kinds = view.kinds(lo, hi)
    for keys, seqs, values in view.columns(lo, hi, False):
        rows = zip(keys, seqs, values, strict=True)
        yield from live_expiring(rows, kinds.ranges, kinds.clock, kinds.merging)
    del view


class ReadSurface:
    """Reads shared by every handle; hosts implement ``_view_for`` and ``_version``.

    The mapping protocol follows ``dict`` (and rocksdict, lmdb, dbm): ``db[key]`` raises
    ``KeyError`` for an absent key, ``key in db``, ``iter(db)`` and :meth:`keys` yield keys,
    :meth:`values`, :meth:`items`, so ``dict(db)`` copies a database. :meth:`iter` is the
    seekable cursor and yields ``(key, value)`` pairs, as ``items()`` does.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # Db(url) would otherwise fail naming the constructor's internal arguments.
        if args and isinstance(args[0], str | os.PathLike) and hasattr(cls, "open"):
            name = cls.__name__
            raise InvalidType(
                f"{name}({args[0]!r}) does not open a database; use {name}.open({args[0]!r})"
                " (the constructor is internal)"
            )
        return super().__new__(cls)

    def _view_for(self, start: bytes, end: bytes | None) -> View:
        """A consistent view of ``[start, end)`` (memtable entries frozen now)."""
        raise NotImplementedError

    def _version(self, key: bytes) -> Version | None:
        """The newest version of ``key`` (``(seq, None)`` for a tombstone), or None."""
        raise NotImplementedError

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` in this handle's view, or ``default`` if it is absent,
        deleted or expired (``Db`` overrides it with its memtable fast path)."""
        version = self._version(key)
        if version is None or version[1] is None:
            return default
        return version[1]

    def iter(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        *,
        reverse: bool = False,
        prefix: bytes | None = None,
    ) -> DbIterator:
        """An iterator of ``(key, value)`` with ``start <= key < end`` (and starting with
        ``prefix`` if given), ascending or with ``reverse`` descending, over the view taken
        now; :meth:`DbIterator.seek` repositions it on that same view. It yields pairs, like
        :meth:`items` (and rocksdict's ``iter``); ``iter(db)`` yields keys, as a dict does.

        Raises:
            InvalidArgument: bounds that are not bytes, or ``start`` after ``end``.
        """
        lo, hi = key_bounds(start, end, prefix)
        return DbIterator(self._view_for(lo, hi), lo, hi, reverse=reverse)

    def scan(
        self,
        start: bytes = b"",
        end: bytes | None = None,
        *,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs with ``start <= key < end`` in key order (end None = all),
        descending with ``reverse``, at most ``limit`` of them, from one consistent view
        taken when ``scan`` is called (expiry judged as of then)."""
        if reverse or limit is not None:
            return self._scan_ordered(start, end, reverse, limit)
        check_range(start, end)
        view = self._view_for(start, end)
        return _keeping(
            view,
            scan_merged(
                view.tables,
                view.entries,
                view.manifest,
                start,
                end,
                ranges=view.ranges,
                clock=frozen_clock(view.clock),
                merging=view.merging,
            ),
        )

    def _scan_ordered(
        self, start: bytes, end: bytes | None, reverse: bool, limit: int | None
    ) -> Iterator[tuple[bytes, bytes]]:
        lo, hi = key_bounds(start, end, None)
        limit = check_limit(limit)
        return limited(self._view_for(lo, hi).rows(lo, hi, reverse), limit)

    def scan_prefix(
        self, prefix: bytes, *, reverse: bool = False, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` of the keys starting with ``prefix``, in key order (or reverse),
        at most ``limit`` of them, from one consistent view."""
        lo, hi = key_bounds(None, None, prefix)
        limit = check_limit(limit)
        return limited(self._view_for(lo, hi).rows(lo, hi, reverse), limit)

    def scan_batches(
        self,
        start: bytes = b"",
        end: bytes | None = None,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        reverse: bool = False,
        format: BatchFormat = "rows",
    ) -> Iterator[Any]:
        """The rows of ``scan(start, end)`` in batches of ``batch_size`` (the last may be
        shorter), so bulk reads cost a Python call per batch rather than per row.

        Args:
            format: ``"rows"``: lists of ``(key, value)``; ``"columns"``: ``(keys,
                values)``, two lists (the fastest: no object per row); ``"arrow"``: pyarrow
                ``RecordBatch``es with binary columns ``key`` and ``value``.

        Raises:
            InvalidArgument: bad bounds, batch size or format; ``"arrow"`` without pyarrow.
        """
        lo, hi = key_bounds(start, end, None)
        view = self._view_for(lo, hi)
        return rows_or_batches(view, lo, hi, reverse=reverse, batch_size=batch_size, fmt=format)

    def keys(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        *,
        reverse: bool = False,
        prefix: bytes | None = None,
    ) -> Iterator[bytes]:
        """The live keys with ``start <= key < end`` (and ``prefix``), in key order or
        ``reverse``, from one view taken now (``list(db.keys())``, ``dict(db)``)."""
        return (key for keys, _ in self._columns(start, end, reverse, prefix) for key in keys)

    def values(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        *,
        reverse: bool = False,
        prefix: bytes | None = None,
    ) -> Iterator[bytes]:
        """The values of :meth:`keys`' keys, in the same order, from one view."""
        return (v for _, values in self._columns(start, end, reverse, prefix) for v in values)

    def items(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        *,
        reverse: bool = False,
        prefix: bytes | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` of :meth:`keys`' keys, in the same order, from one view
        (``dict(db.items())`` copies one consistent view; ``dict(db)`` reads each key again
        after listing them, as ``dict`` does with any mapping)."""
        return (
            pair
            for keys, values in self._columns(start, end, reverse, prefix)
            for pair in zip(keys, values, strict=True)
        )

    def items_with_expiry(
        self, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes, int | None]]:
        """``(key, value, expire_at_ms)`` of the live keys with ``start <= key < end``, in
        key order, from one view taken now: ``expire_at_ms`` (wall clock, ms since the
        epoch) for a value written with a TTL, else None. A copy that must keep the TTLs
        reads this rather than :meth:`scan` (a replica seeded from a snapshot, then following
        ``WalReader.iter(snapshot.seq + 1)``): ``put(key, value, ttl=(expire_at_ms -
        now_ms - 0.5) / 1000)`` expires when the original does. The view is taken at the
        call, as :meth:`scan`'s."""
        lo, hi = key_bounds(start, end, None)
        view = self._view_for(lo, hi)
        return _expiring(view, lo, hi)

    def _columns(
        self, start: bytes | None, end: bytes | None, reverse: bool, prefix: bytes | None
    ) -> Iterator[tuple[list[bytes], list[bytes]]]:
        lo, hi = key_bounds(start, end, prefix)
        view = self._view_for(lo, hi)
        batches: Iterator[tuple[list[bytes], list[bytes]]] = rows_or_batches(
            view, lo, hi, reverse=reverse, batch_size=DEFAULT_BATCH_SIZE, fmt="columns"
        )
        return batches

    def get_key_value(self, key: bytes) -> KeyValue | None:
        """``KeyValue(key, value, seq)`` for a live key (``seq``: the write that set it), or
        None when the key is absent or deleted."""
        key = check_key(key)
        version = self._version(key)
        if version is None or version[1] is None:
            return None
        return KeyValue(key, version[1], version[0])

    def __getitem__(self, key: bytes) -> bytes:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[bytes]:
        """The live keys in order, from one view (as iterating a dict or ``rocksdict``;
        without this, ``__getitem__`` would make Python try integer indexes)."""
        return self.keys()


class WriteBatchContext(WriteBatch):
    """A :class:`WriteBatch` that ``with`` writes on a clean exit (nothing on an exception)."""

    __slots__ = ("_await_durable", "_db")

    def __init__(self, db: WriteSurface, *, await_durable: bool) -> None:
        super().__init__()
        self._db = db
        self._await_durable = await_durable

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self._db.write(self, await_durable=self._await_durable)


class WriteSurface:
    """The mapping-style writes of ``Db``; hosts implement ``put``, ``delete``, ``write``."""

    def put(self, key: bytes, value: bytes, *, await_durable: bool = True) -> None:
        raise NotImplementedError

    def delete(self, key: bytes, *, await_durable: bool = True) -> None:
        raise NotImplementedError

    def write(self, batch: WriteBatch, *, await_durable: bool = True) -> None:
        raise NotImplementedError

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.put(key, value)

    def __delitem__(self, key: bytes) -> None:
        """Delete ``key``; ``KeyError`` if it has no live value, as the mapping protocol
        (``dict``, ``dbm``, ``shelve``) promises. That costs a read first; :meth:`delete` is
        the blind write, silent for an absent key."""
        if key not in self:
            raise KeyError(key)
        self.delete(key)

    def __contains__(self, key: object) -> bool:
        raise NotImplementedError

    def write_batch(self, *, await_durable: bool = True) -> WriteBatchContext:
        """A batch written atomically when its ``with`` block ends without an exception."""
        return WriteBatchContext(self, await_durable=await_durable)
