"""Scans of SSTs: entries in key order (forward, reverse, or a whole SST for compaction),
chunk after chunk of consecutive blocks (:mod:`slatepy.table.chunks`), the next chunks
fetched by read-ahead threads while one is consumed."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from slatepy.format.block import Entry
from slatepy.table.chunks import _Chunk, _ChunkLoader
from slatepy.table.grouping import Columns, Piece, _piece, grouped
from slatepy.table.sst_tops import SCAN_READ_AHEAD_MIN, SstTops

T = TypeVar("T")


class ReadAhead:
    """The read-ahead threads of one scan, shared by its streams: the SSTs of a merged scan
    (every L0 SST and run) or of a sorted run, each of which used to start a pool of its own
    (a merged scan over 20 L0 SSTs started about 50 threads; sharing them saved 7-17% of
    its CPU: RFC 0006, stop 41 addendum).

    The pool starts at the first :meth:`submit` and ends when the last stream that joined
    leaves (:meth:`leave`, in the stream's ``finally``), so no thread outlives the scan; a
    stream joining later starts it again. At most ``workers`` requests run at once; threads
    start only when no idle one can take a request.
    """

    def __init__(self, tables: SstTops, workers: int) -> None:
        self._tables = tables
        self._workers = workers
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._users = 0

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """``fn(*args, **kwargs)`` on a read-ahead thread, for a caller that joined."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self._workers, thread_name_prefix="slatepy-read-ahead"
                )
                self._tables._count("read_ahead_threads")
            return self._pool.submit(fn, *args, **kwargs)

    def join(self) -> None:
        """Count the caller as a user (before its first :meth:`submit`)."""
        with self._lock:
            self._users += 1

    def leave(self, futures: Collection[Future[Any]]) -> None:
        """A user is done: its ``futures`` not yet running are cancelled and those running
        waited for (a stream's reads end with it); the last user to leave ends the pool."""
        try:
            for future in futures:
                future.cancel()
            wait(futures)
        finally:  # interrupted or not, the user is gone
            with self._lock:
                self._users -= 1
                pool = self._pool if self._users == 0 else None
                if pool is not None:
                    self._pool = None
            if pool is not None:
                pool.shutdown(wait=True)


class Scans(SstTops):
    """The scans of :class:`~slatepy.table.reader.TableReader`."""

    # -- scans --------------------------------------------------------------------------

    def scan(
        self,
        path: str,
        start: bytes,
        end: bytes | None,
        *,
        size: int | None = None,
        continued: bool = False,
    ) -> Iterator[Entry]:
        """Entries with ``start <= key < end`` in key order.

        Blocks not in the cache are read in chunks of consecutive blocks, one ranged GET
        each, starting at ``SCAN_READ_AHEAD_MIN`` bytes and growing fourfold up to
        ``scan_read_ahead_bytes``, so a long scan costs a few large GETs and a short one reads
        little extra. Once a chunk needed the store, the next one is loaded by a background
        thread while this one is consumed. Cached blocks are used; blocks read go to the block
        cache only from the first chunk (see :meth:`_ChunkLoader.load`).

        Args:
            continued: The scan has already read a whole SST before this one (the next SST
                of a sorted run): it is long, so its chunks start at the largest size.
        """
        top = self._tops.get(path) or self.top(path, size=size)
        props = top.props
        if props.first_key is None or props.last_key is None:
            return
        if props.last_key < start or (end is not None and props.first_key >= end):
            return
        loader = _ChunkLoader(self, path, top, end, cached=True, tail=b"", tail_start=0)
        first = self.scan_read_ahead_bytes if continued else SCAN_READ_AHEAD_MIN
        yield from self._stream(loader, start, end, background=True, first_bytes=first)

    def scan_columns(
        self,
        path: str,
        start: bytes,
        end: bytes | None,
        *,
        size: int | None = None,
        continued: bool = False,
        reverse: bool = False,
        read_ahead_bytes: int | None = None,
        read_ahead: ReadAhead | None = None,
    ) -> Iterator[Columns]:
        """The entries of :meth:`scan` a block or more at a time (:func:`grouped`), as
        parallel lists (:data:`Columns`), so a bulk reader pays per group, not per entry.

        With ``reverse`` the blocks come last to first and each block's lists are in
        descending key order. A reverse scan reads consecutive blocks backwards in chunks of
        one ranged GET each, growing like a forward scan's, without background read-ahead.

        Args:
            read_ahead_bytes: The largest chunk of this scan, when it is one of several
                sources of a merged scan that share ``scan_read_ahead_bytes`` (so that a
                merge's read-ahead memory does not grow with its sources); at least
                ``SCAN_READ_AHEAD_MIN``. None: ``scan_read_ahead_bytes``.
            read_ahead: The threads to read ahead with, shared with the scan's other
                streams (None: a pool of this scan's own).
        """
        top = self._tops.get(path) or self.top(path, size=size)
        props = top.props
        if props.first_key is None or props.last_key is None:
            return
        if props.last_key < start or (end is not None and props.first_key >= end):
            return
        loader = _ChunkLoader(self, path, top, end, cached=True, tail=b"", tail_start=0)
        limit = self.scan_read_ahead_bytes
        if read_ahead_bytes is not None:
            limit = max(SCAN_READ_AHEAD_MIN, min(limit, read_ahead_bytes))
        if reverse:
            yield from grouped(self._stream_reverse(loader, start, end, limit))
            return
        first = limit if continued else SCAN_READ_AHEAD_MIN
        yield from grouped(
            self._stream_columns(
                loader,
                start,
                end,
                background=True,
                first_bytes=first,
                limit=limit,
                read_ahead=read_ahead,
            )
        )

    def _stream_reverse(
        self, loader: _ChunkLoader, start: bytes, end: bytes | None, limit: int
    ) -> Iterator[Piece]:
        """Blocks from the last one holding a key below ``end`` back to the one holding
        ``start``; each chunk of blocks is one ranged GET, the chunks growing fourfold."""
        last = loader.last_block(end)
        budget = SCAN_READ_AHEAD_MIN
        while last >= 0:
            first = loader.back_from(last, budget, start)
            chunk = loader.load_span(first, last)
            for k in range(last - first, -1, -1):
                block = loader.block(chunk, k)
                keys = block.keys
                hi = len(keys) if end is None or keys[-1] < end else bisect_left(keys, end)
                lo = bisect_left(keys, start) if keys[0] < start else 0
                if hi > lo:
                    ks, ss, vs, plain = _piece(block, lo, hi)
                    ks.reverse()
                    ss.reverse()
                    vs.reverse()
                    yield ks, ss, vs, plain
                if keys[0] <= start:
                    return
            last = first - 1
            budget = min(budget * 4, limit)

    def scan_all(self, path: str, *, chunk_bytes: int, size: int | None = None) -> Iterator[Entry]:
        """Every entry in key order, for compaction: ``chunk_bytes`` per ranged GET, and
        nothing goes through or into the caches (nor is the SST pinned), so a compaction
        neither floods the store with requests nor evicts the read path's blocks. An SST
        that fits in the bytes read to open it (most WAL SSTs) costs that one GET.
        """
        loader = self._uncached_loader(path, size)
        if loader is not None:
            yield from self._stream(
                loader, b"", None, background=False, first_bytes=chunk_bytes, limit=chunk_bytes
            )

    def scan_all_columns(
        self, path: str, *, chunk_bytes: int, size: int | None = None
    ) -> Iterator[Piece]:
        """The entries of :meth:`scan_all` (read the same way: ``chunk_bytes`` per ranged
        GET, no caches) a block at a time, as :data:`Piece` columns: compaction's columnar
        path merges and writes whole runs of plain entries without a step per entry."""
        loader = self._uncached_loader(path, size)
        if loader is not None:
            yield from self._stream_columns(
                loader, b"", None, background=False, first_bytes=chunk_bytes, limit=chunk_bytes
            )

    def _uncached_loader(self, path: str, size: int | None) -> _ChunkLoader | None:
        """The loader of a whole-SST read that bypasses the caches (the bytes read to open
        it are its first chunk), or None for an SST without blocks."""
        top = self._tops.get(path)
        tail, tail_start = b"", 0
        if top is None:
            top, tail, tail_start = self._open(path, size)
        if top.props.block_count == 0:
            return None
        return _ChunkLoader(self, path, top, None, cached=False, tail=tail, tail_start=tail_start)

    def _stream(
        self,
        loader: _ChunkLoader,
        start: bytes,
        end: bytes | None,
        *,
        background: bool,
        first_bytes: int,
        limit: int | None = None,
    ) -> Iterator[Entry]:
        """The entries of :meth:`_stream_columns`, one by one."""
        for keys, seqs, values, _ in self._stream_columns(
            loader, start, end, background=background, first_bytes=first_bytes, limit=limit
        ):
            yield from zip(keys, seqs, values, strict=True)

    def _stream_columns(
        self,
        loader: _ChunkLoader,
        start: bytes,
        end: bytes | None,
        *,
        background: bool,
        first_bytes: int,
        limit: int | None = None,
        read_ahead: ReadAhead | None = None,
    ) -> Iterator[Piece]:
        """Decode chunk after chunk, yielding each block's entries in ``[start, end)`` as a
        :data:`Piece` (the cached block's own lists when it is whole: read only).

        With ``background``, once a chunk needed the store (so
        warm and short scans never start a thread), the next ``scan_requests_in_flight``
        chunks are planned here and fetched by as many threads while this one is consumed:
        at most ``scan_requests_in_flight + 1`` chunks in memory, and that many GETs in
        flight, so a scan is not bound by one request's latency plus its transfer. The
        threads are ``read_ahead``'s when given (shared with the scan's other streams)."""
        depth = self.scan_requests_in_flight
        budget = first_bytes
        limit = limit or self.scan_read_ahead_bytes
        chunk: _Chunk | None = loader.load(loader.first_block(start), budget)
        following = 0 if chunk is None else chunk.first + len(chunk.first_keys)
        planned_all = chunk is None or chunk.done
        ahead: deque[Future[_Chunk]] = deque()
        joined: ReadAhead | None = None
        try:
            while chunk is not None:
                if background and chunk.fetched:
                    while not planned_all and len(ahead) < depth:
                        budget = min(budget * 4, limit)
                        planned = loader.plan(following, budget)
                        if planned is None:
                            planned_all = True
                            break
                        following = planned.first + len(planned.first_keys)
                        planned_all = planned.done
                        if joined is None:
                            joined = read_ahead or ReadAhead(self, depth)
                            joined.join()
                        ahead.append(joined.submit(loader.fetch, planned))
                for k in range(len(chunk.first_keys)):
                    block = loader.block(chunk, k)
                    keys = block.keys
                    lo = bisect_left(keys, start) if keys[0] < start else 0
                    if end is not None and keys[-1] >= end:
                        hi = bisect_left(keys, end)
                        if hi > lo:
                            yield _piece(block, lo, hi)
                        return
                    if lo:
                        yield _piece(block, lo, len(keys))
                    else:
                        yield keys, block.seqs, block.values, block.plain
                if ahead:
                    chunk = ahead.popleft().result()
                elif planned_all:
                    return
                else:
                    budget = min(budget * 4, limit)
                    chunk = loader.load(following, budget)
                    if chunk is not None:
                        following = chunk.first + len(chunk.first_keys)
                        planned_all = chunk.done
        finally:
            if joined is not None:
                joined.leave(ahead)
