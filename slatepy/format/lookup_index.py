"""Writing the lookup index of a version 6 columnar block (the layout:
:mod:`slatepy.format.lookup`)."""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import add

import xxhash

LOOKUP_ARRAY = 0x95
"""The first byte of a body with an index (a fixarray of five; version 5's has four)."""
TRAILER = struct.Struct("<IIBB")
"""count | slots | offset width | slot width."""
BIG_ENDIAN = sys.byteorder == "big"
FORMATS = {1: "B", 2: "H", 4: "I"}
"""``array`` typecodes of 1, 2 and 4-byte unsigned ints (the ``memoryview`` ones too)."""
BIN_HEADER = {0xC4: 2, 0xC5: 3, 0xC6: 5}
"""msgpack bin headers (bin 8, 16, 32) and their sizes."""
_h64 = xxhash.xxh3_64_intdigest


def _bin_size(length: int) -> int:
    """Bytes of a msgpack bin of ``length`` bytes, its header included (msgspec writes the
    smallest header, as the msgpack spec asks)."""
    return length + (2 if length < 256 else 3 if length < 65536 else 5)


def _array_header(count: int) -> int:
    return 1 if count < 16 else 3 if count < 65536 else 5


def _starts(items: list[bytes], at: int, width: int | None = None) -> Sequence[int]:
    """Where each of ``items``' bins starts from ``at``, and where the last one ends
    (``width``: the length of every item, when the caller knows they have one)."""
    if width is not None:
        step = _bin_size(width)
        return range(at, at + step * (len(items) + 1), step)
    lengths = list(map(len, items))
    longest = max(lengths)
    if min(lengths) == longest:  # one size (fixed-size keys or values): a range
        step = _bin_size(longest)
        return range(at, at + step * (len(items) + 1), step)
    if longest < 256:  # bin 8 headers only: in C
        return list(accumulate(map(add, lengths, repeat(2)), initial=at))
    return list(accumulate(map(_bin_size, lengths), initial=at))


def _packed(values: Sequence[int], width: int) -> bytes:
    """``values`` as little-endian unsigned ints of ``width`` bytes (a ``range`` through
    numpy: an ``array`` of one costs ten times more)."""
    import numpy as np

    if isinstance(values, range):
        column = np.arange(values.start, values.stop, values.step, dtype=f"<u{width}")
    else:
        column = np.array(values, dtype=f"<u{width}")
    return column.tobytes()


def _slots(keys: list[bytes], slot_width: int) -> bytes:
    """The hash table of ``keys`` (see :mod:`slatepy.format.lookup`), little-endian.

    Vectorized with numpy (imported here, as the filters do, so that ``import slatepy``
    does not pay for it): the entries are placed in the order of their home slots, each at
    its home slot or just after the one placed before it, whichever is later, which is a
    running maximum; every entry then sits at or after its home slot with no empty slot in
    between, all a lookup's probing needs.
    """
    import numpy as np

    count = len(keys)
    hashes = np.fromiter(map(_h64, keys), dtype=np.uint64, count=count)
    homes = (hashes % np.uint64(2 * count)).view(np.int64)  # below 2**63: the same ints
    order = np.argsort(homes, kind="stable")
    ranks = np.arange(count, dtype=np.int64)
    places = np.maximum.accumulate(homes[order] - ranks) + ranks
    empty = (1 << (8 * slot_width)) - 1
    slots = np.full(max(2 * count, int(places[-1]) + 1), empty, dtype=f"<u{slot_width}")
    slots[places] = order
    return slots.tobytes()


def slot_width(count: int) -> int:
    """Bytes of a slot of a block of ``count`` entries (all ones marks an empty slot)."""
    return 1 if count < 255 else 2 if count < 65535 else 4


def build_index(
    flags: bytes,
    keys: list[bytes],
    values: list[bytes],
    seqs: int,
    widths: tuple[int, int] | None = None,
) -> tuple[bytes, int]:
    """The index of a body ``[flags, keys, values, seqs, index]`` of these columns (``keys``
    not empty; a tombstone's value empty; ``seqs`` the seqs column's length), and the size
    that body must have: the offsets follow from the msgpack sizes the encoder is expected
    to write, and the caller checks that it did (another size is a bug, and would make
    lookups read the wrong bytes). ``widths``: the length of every key and of every value,
    when the caller knows them to be alike (a bulk add of rows of one size: no length is
    measured then; the body's size check holds the encoder to them all the same)."""
    key_width, value_width = (None, None) if widths is None else widths
    count = len(keys)
    key_at = _starts(keys, 1 + _bin_size(len(flags)) + _array_header(count), key_width)
    value_at = _starts(values, key_at[-1] + _array_header(count), value_width)
    width = 2 if value_at[-1] < 65536 else 4
    slot_bytes = slot_width(count)
    slots = _slots(keys, slot_bytes)
    index = b"".join(
        (
            _packed(key_at, width),
            _packed(value_at, width),
            slots,
            TRAILER.pack(count, len(slots) // slot_bytes, width, slot_bytes),
        )
    )
    return index, value_at[-1] + _bin_size(seqs) + _bin_size(len(index))
