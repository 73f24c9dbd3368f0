"""Updates ``((key, value), time, diff)`` and their encoding as entries of the engine's SST
format (RFC 0015 §2, §5.1); the write path's encode step (``persist/pipeline.py``).
Validation is ``persist/validate.py``, consolidation ``persist/consolidation.py``.

One update is one entry: the **key** is ``esc(k) ‖ esc(v) ‖ t`` (``t`` as u64 big-endian)
where ``esc(x) = x.replace(b"\\0", b"\\0\\xff") + b"\\0\\x01"``; the **seq** is ``t``; the
**value** is the diff as i64 little-endian. The escape preserves order: comparing encoded
keys byte by byte is comparing ``(k, v, t)`` tuples, so sorted runs of different writers
merge as byte strings, and equal ``(k, v)`` sit together with ascending times. A terminator
``\\0\\x01`` is unambiguous because every ``\\0`` of the data is followed by ``\\xff``.

Inline parts (small batches kept in the state itself) are one data block of that layout
(``format/block.py``), so one entry decoder serves inline and blob parts. Nothing here does
I/O.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence
from itertools import repeat
from typing import cast

from slatepy.errors import CorruptionError
from slatepy.format.block import BlockBuilder, Entry, decode_block
from slatepy.persist.errors import UsageError

Update = tuple[tuple[bytes, bytes], int, int]
"""``((key, value), time, diff)``."""

U64_MAX = (1 << 64) - 1
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1
MAX_ENCODED_KEY = 65_535
"""Largest encoded key: the SST format stores key lengths as u16."""
ALWAYS_FITS = (MAX_ENCODED_KEY - 12) // 2
"""Key plus value lengths whose encoding fits whatever their NULs (each NUL costs one more
byte): below this the exact, slower count is skipped."""

_TIME = struct.Struct(">Q")
_DIFF = struct.Struct("<q")
_TERMINATOR = b"\0\x01"
_ESCAPED_NUL = b"\0\xff"
_first = operator.itemgetter(0)
_second = operator.itemgetter(1)
_third = operator.itemgetter(2)
_pair_and_time = operator.itemgetter(0, 1)
_last_8 = operator.itemgetter(slice(-8, None))
_all_but_8 = operator.itemgetter(slice(None, -8))
_split_fields = operator.methodcaller("split", _TERMINATOR)


def escape(data: bytes) -> bytes:
    """``data`` with every NUL escaped, terminated: order-preserving as a tuple field."""
    return data.replace(b"\0", _ESCAPED_NUL) + _TERMINATOR


def encoded_key_size(key: bytes, value: bytes) -> int:
    """Length of the encoded key of ``(key, value)`` at any time."""
    return len(key) + key.count(0) + len(value) + value.count(0) + 12


def encode_key(key: bytes, value: bytes, time: int) -> bytes:
    """The entry key of ``(key, value)`` at ``time`` (inputs assumed valid)."""
    return escape(key) + escape(value) + _TIME.pack(time)


def encode_columns(updates: Sequence[Update]) -> tuple[list[bytes], list[int], list[bytes]]:
    """The SST entries of consolidated, sorted updates as parallel lists (keys
    :func:`encode_key`, seqs = times, values :func:`encode_diff`), built by C-level maps:
    the bulk path of writing a batch (``SstBuilder.extend``)."""
    pairs = list(map(_first, updates))
    times = list(map(_second, updates))
    escaped_keys = map(bytes.replace, map(_first, pairs), repeat(b"\0"), repeat(_ESCAPED_NUL))
    escaped_values = map(bytes.replace, map(_second, pairs), repeat(b"\0"), repeat(_ESCAPED_NUL))
    fields = zip(
        escaped_keys,
        repeat(_TERMINATOR),
        escaped_values,
        repeat(_TERMINATOR),
        map(_TIME.pack, times),
    )
    keys = list(map(b"".join, fields))
    return keys, times, list(map(_DIFF.pack, map(_third, updates)))


def _unescape_field(data: bytes, start: int, what: str) -> tuple[bytes, int]:
    end = data.find(_TERMINATOR, start)
    if end < 0:
        raise CorruptionError(f"persist update key: {what} has no terminator")
    field = data[start:end]
    if field.count(0) != field.count(_ESCAPED_NUL):
        raise CorruptionError(f"persist update key: {what} has an unescaped NUL")
    return field.replace(_ESCAPED_NUL, b"\0"), end + len(_TERMINATOR)


def decode_key(data: bytes) -> tuple[bytes, bytes, int]:
    """Split an entry key into ``(key, value, time)``.

    Raises:
        CorruptionError: the bytes are not an encoded update key.
    """
    key, pos = _unescape_field(data, 0, "key")
    value, pos = _unescape_field(data, pos, "value")
    if len(data) - pos != _TIME.size:
        raise CorruptionError("persist update key: the time is not the last 8 bytes")
    (time,) = _TIME.unpack_from(data, pos)
    return key, value, time


def encode_diff(diff: int) -> bytes:
    """A diff as the entry value (i64 little-endian)."""
    return _DIFF.pack(diff)


def decode_entry(key: bytes, seq: int, value: bytes | None) -> Update:
    """The update an SST (or inline block) entry holds.

    Raises:
        CorruptionError: a tombstone, a value that is not 8 bytes, or a seq that is not the
            key's time.
    """
    k, v, t = decode_key(key)
    if value is None or len(value) != _DIFF.size:
        raise CorruptionError("persist update entry: the value is not an 8-byte diff")
    if seq != t:
        raise CorruptionError(f"persist update entry: seq {seq} is not the key's time {t}")
    return (k, v), t, _DIFF.unpack(value)[0]


def decode_entries(entries: Sequence[Entry]) -> list[Update]:
    """The updates of many SST entries (:func:`decode_entry` on each), by C-level maps and
    one ``struct`` call per column when no field holds a NUL (then the two terminators are
    the only NULs before the time), else entry by entry.

    Raises:
        CorruptionError: as :func:`decode_entry`.
    """
    keys: list[bytes] = list(map(_first, entries))
    seqs: list[int] = list(map(_second, entries))
    values: list[bytes | None] = list(map(_third, entries))
    diffs_bytes = cast("list[bytes]", values)  # once None is ruled out below
    count = len(keys)
    heads: list[bytes] = list(map(_all_but_8, keys))
    if (
        not count
        or set(map(bytes.count, heads, repeat(b"\0"))) != {2}
        or None in values
        or set(map(len, diffs_bytes)) != {_DIFF.size}
        or b"".join(map(_last_8, keys)) != _times(count, seqs)
    ):
        return [decode_entry(*entry) for entry in entries]
    fields = list(map(_split_fields, heads))
    if set(map(len, fields)) != {3}:  # a misplaced terminator: the loop says where
        return [decode_entry(*entry) for entry in entries]
    pairs = zip(map(_first, fields), map(_second, fields), strict=True)
    diffs = struct.unpack(f"<{count}q", b"".join(diffs_bytes))
    return list(zip(pairs, seqs, diffs, strict=True))


def _times(count: int, seqs: list[int]) -> bytes:
    try:
        return struct.pack(f">{count}Q", *seqs)
    except struct.error:
        return b""  # a seq that is no u64: the per-entry path reports it


def encode_inline(updates: Sequence[Update]) -> bytes:
    """Encode consolidated updates as an inline part (one data block).

    Raises:
        UsageError: no updates, a zero diff, or updates not strictly sorted by (k, v, t).
    """
    if not updates:
        raise UsageError("an inline part needs at least one update")
    builder = BlockBuilder()
    previous: tuple[bytes, bytes, int] | None = None
    for (key, value), time, diff in updates:
        triple = (key, value, time)
        if diff == 0 or (previous is not None and triple <= previous):
            raise UsageError("inline part updates must be consolidated (sorted, no zero diffs)")
        previous = triple
        builder.add(encode_key(key, value, time), time, encode_diff(diff))
    return builder.finish()


def decode_inline(data: bytes) -> list[Update]:
    """Decode an inline part.

    Raises:
        CorruptionError: a checksum or layout error, or an entry that is not an update.
    """
    block = decode_block(data)
    return [
        decode_entry(key, seq, value)
        for key, seq, value in zip(block.keys, block.seqs, block.values, strict=True)
    ]
