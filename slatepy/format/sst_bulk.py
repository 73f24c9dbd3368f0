"""The bulk adds of :class:`slatepy.format.sst_builder.SstBuilder`: many entries at once
with the per-entry work done by C-level maps and the block cuts found by bisecting
cumulative sizes, the same bytes as adding them one by one (WAL SSTs, persist's batch parts,
compaction's columnar path).

:class:`BulkAdds` is the builder's base class: it declares the builder's state it uses,
which :class:`~slatepy.format.sst_builder.SstBuilder` sets up.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate, chain, islice, repeat

from slatepy.errors import InvalidArgument
from slatepy.format.block import (
    BLOCK_OVERHEAD,
    ENTRY_HEADER,
    OFFSET,
    BlockBuilder,
    entry_headers,
    finish_block,
)
from slatepy.format.columnar import BLOCK_OVERHEAD as COLUMN_BLOCK_OVERHEAD
from slatepy.format.columnar import ENTRY_OVERHEAD as COLUMN_ENTRY_OVERHEAD
from slatepy.format.columnar import ColumnBlockBuilder
from slatepy.format.sst_index import INDEXED_BLOCKS_VERSION


class BulkAdds:
    """:meth:`extend` and :meth:`extend_below` of an SST builder (see the module)."""

    # The builder's state these use (set by SstBuilder.__init__).
    _version: int
    _block_size: int
    _columnar: bool
    _block: BlockBuilder | ColumnBlockBuilder
    _block_first: bytes | None
    _first_key: bytes | None
    _last_key: bytes | None
    _count: int
    _min_seq: int | None
    _max_seq: int
    _p_keys: list[bytes] | None

    def add(self, key: bytes, seq: int, value: bytes | None) -> None:
        raise NotImplementedError

    @property
    def estimated_size(self) -> int:
        raise NotImplementedError

    def _add_block(self, data: bytes) -> None:
        raise NotImplementedError

    def extend(self, keys: list[bytes], seqs: list[int], values: list[bytes]) -> None:
        """Add many entries (no tombstones) in strictly increasing key order: the same bytes
        as :meth:`add` one by one, with the per-entry work done by C-level maps, the block
        cuts found by bisecting cumulative sizes, and each block's bytes copied once (the
        bulk path of persist's batch parts).

        Raises:
            InvalidArgument: the keys are not strictly increasing (after those added before).
        """
        if not keys:
            return
        self._check_order(keys, 0)
        if self._columnar:
            self._extend_columns(keys, seqs, values, _column_ends(keys, values, 0))
            return
        self._added(keys, seqs, 0, len(keys))
        indexed = self._version >= INDEXED_BLOCKS_VERSION
        sizes = list(map(operator.add, map(len, keys), map(len, values)))
        # ends[j]: the block bytes the entries before j take, offsets included (the fixed
        # overhead aside); a block closes at the first entry that brings it to ``room``.
        per_entry = ENTRY_HEADER.size + (OFFSET.size if indexed else 0)
        ends = list(accumulate(map(operator.add, sizes, repeat(per_entry)), initial=0))
        room = self._block_size - BLOCK_OVERHEAD
        begin = 0
        while begin < len(keys):
            block = self._block  # entries of add() or of an earlier extend may be open
            assert isinstance(block, BlockBuilder)
            end = bisect_left(ends, ends[begin] + room - block.filled, begin + 1)
            cut = slice(begin, end)
            if not len(block):
                self._block_first = keys[begin]
            if self._p_keys is not None:  # a new list once _close_block closes a partition
                self._p_keys += keys[cut]
            headers = entry_headers(keys[cut], seqs[cut], values[cut])
            if end >= len(ends):  # the last entries stay in the open block for later adds
                entries = list(map(b"".join, zip(headers, keys[cut], values[cut], strict=True)))
                block.extend(entries, sum(map(len, entries)))
                return
            count = len(block) + end - begin
            parts = block.take()
            entry_sizes = chain(
                list(map(len, parts)), map(operator.add, sizes[cut], repeat(ENTRY_HEADER.size))
            )
            parts += chain.from_iterable(zip(headers, keys[cut], values[cut], strict=True))
            self._add_block(finish_block(parts, entry_sizes, count, indexed))
            begin = end

    def _check_order(self, keys: list[bytes], begin: int) -> None:
        """Raise unless ``keys[begin:]`` are strictly increasing, after those added before."""
        last = self._last_key
        if (last is not None and keys[begin] <= last) or not all(
            map(operator.lt, islice(keys, begin, None), islice(keys, begin + 1, None))
        ):
            raise InvalidArgument("SST keys must be added in strictly increasing order")

    def _added(self, keys: list[bytes], seqs: list[int], begin: int, end: int) -> None:
        """Account for entries ``begin:end`` (``begin < end``): key range, count, seqs."""
        if self._first_key is None:
            self._first_key = keys[begin]
        whole = begin == 0 and end == len(seqs)
        lo_seq = min(seqs) if whole else min(islice(seqs, begin, end))
        hi_seq = max(seqs) if whole else max(islice(seqs, begin, end))
        self._min_seq = lo_seq if self._min_seq is None else min(self._min_seq, lo_seq)
        self._max_seq = max(self._max_seq, hi_seq)
        self._last_key = keys[end - 1]
        self._count += end - begin

    def _extend_columns(
        self,
        keys: list[bytes],
        seqs: list[int],
        values: list[bytes],
        ends: Sequence[int],
        *,
        begin: int = 0,
        limit: int | None = None,
    ) -> int:
        """Add entries ``begin:`` (checked to be in order) into columnar blocks: each
        block's slice of the lists is appended to the open block whole (the encoding
        happens in C when it closes). ``ends[r]`` is the estimated bytes entries
        ``begin:begin + r`` take (:func:`_column_ends`); a block closes at the first entry
        that brings it to its room. With ``limit`` (:meth:`extend_below`), stop before an
        entry once :attr:`estimated_size` reaches it (entry ``begin`` is always added);
        return the index after the last entry added."""
        block = self._block
        assert isinstance(block, ColumnBlockBuilder)
        room = self._block_size - COLUMN_BLOCK_OVERHEAD
        whole = len(keys) - begin
        # Rows of one size (_column_ends' range): a block of them has no lengths to measure.
        widths = (len(keys[begin]), len(values[begin])) if isinstance(ends, range) else None
        r = 0  # entries added so far
        while r < whole:
            fresh = not len(block)
            closes = bisect_left(ends, ends[r] + room - block.filled, r + 1)
            end = min(closes, whole)
            if limit is not None:
                estimate = self.estimated_size
                if r and estimate >= limit:
                    break
                # Where the estimate before an entry reaches limit, if the block does not
                # close first (ends[e] - ends[r] is what entries r..e-1 add).
                end = min(end, bisect_left(ends, ends[r] + limit - estimate, r + 1))
            i, j = begin + r, begin + end
            if fresh:
                self._block_first = keys[i]
            if self._p_keys is not None:  # a new list once _close_block closes a partition
                self._p_keys += keys[i:j]
            full = i == 0 and j == len(keys)
            block.extend(
                keys if full else keys[i:j],
                seqs if full else seqs[i:j],
                values if full else values[i:j],
                ends[end] - ends[r] - COLUMN_ENTRY_OVERHEAD * (end - r),
            )
            r = end
            if end < closes:  # the block stays open: out of entries, or at the limit
                break
            self._add_block(block.finish(widths) if fresh else block.finish())
        if r:
            self._added(keys, seqs, begin, begin + r)
        return begin + r

    def extend_below(
        self, keys: list[bytes], seqs: list[int], values: list[bytes], begin: int, limit: int
    ) -> int:
        """Add plain entries ``begin:`` (strictly increasing keys, after those added before)
        as a loop of :meth:`add` would that stops before an entry once
        :attr:`estimated_size` reaches ``limit`` (entry ``begin`` is always added); return
        the index after the last entry added. The same bytes as that loop: a compaction
        cuts its outputs this way (``slatepy.compactor.executor``).

        Each step adds at most the rest of the open block, so the size checked before each
        entry is the one :meth:`add` would have seen: a closed block counts as stored
        (compressed, framed), which only closing it tells.

        Raises:
            InvalidArgument: ``keys[begin:]`` are not strictly increasing (after those added
                before); nothing is added then.
        """
        count = len(keys)
        if begin >= count:
            return begin
        if not self._columnar:  # tests and benchmarks of older formats only
            for i in range(begin, count):
                if i > begin and self.estimated_size >= limit:
                    return i
                self.add(keys[i], seqs[i], values[i])
            return count
        self._check_order(keys, begin)
        ends = _column_ends(keys, values, begin)
        return self._extend_columns(keys, seqs, values, ends, begin=begin, limit=limit)


def _column_ends(keys: list[bytes], values: list[bytes], begin: int) -> Sequence[int]:
    """``ends[r]``: the estimated bytes entries ``begin:begin + r`` take in a columnar
    block, in C-level maps; a ``range`` when every key has one length and every value one
    (fixed-size rows, as most compactions write: the same numbers in two checks of about
    40 ns a row, where summing the lengths costs about 180)."""
    count = len(keys) - begin
    value_width = _one_length(values, begin, count)  # values first: most often not alike
    if value_width is not None:
        key_width = _one_length(keys, begin, count)
        if key_width is not None:
            step = key_width + value_width + COLUMN_ENTRY_OVERHEAD
            return range(0, step * (count + 1), step)
    lengths = map(
        operator.add, map(len, islice(keys, begin, None)), map(len, islice(values, begin, None))
    )
    return list(accumulate(map(operator.add, lengths, repeat(COLUMN_ENTRY_OVERHEAD)), initial=0))


def _one_length(column: list[bytes], begin: int, count: int) -> int | None:
    """The length of every item of ``column[begin:]`` (``count`` of them, at least one),
    or None when they differ: they all have the first one's iff their lengths sum to
    ``count`` times it and none is shorter (a join is the cheapest sum: one pass in C,
    which fails most columns of varying lengths on its own)."""
    width = len(column[begin])
    rest = column if not begin else column[begin:]
    if len(b"".join(rest)) != width * count or min(map(len, rest)) != width:
        return None
    return width
