"""Bloom filters with a layout defined by slatepy's format, not by a library.

Layout::

    num_probes u8 | bit array (num_bits = 8 * its length)

Probe ``i`` of key ``k`` sets bit ``(h1 + i * h2) mod num_bits`` (bit ``b`` is bit ``b % 8``
of byte ``b // 8``), where ``h1`` and ``h2`` are the low and high 64 bits of
``XXH3-128(k)`` and ``h2`` is forced odd. Any implementation that follows these lines reads
the same filter; see docs/rfcs/0002-formats.md for why pybloom-live was not used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import islice

import xxhash

from slatepy.errors import CorruptionError

_MASK64 = (1 << 64) - 1
_CHUNK = 16384  # keys hashed and probed at a time by build_filter


def probe_count(bits_per_key: int) -> int:
    """Optimal probe count for a bits-per-key budget (``ln 2 * bits``), kept in [1, 30]."""
    return max(1, min(30, round(bits_per_key * math.log(2))))


def build_filter(keys: Iterable[bytes], count: int, bits_per_key: int) -> bytes:
    """Encode a filter for ``count`` keys (``keys`` yields exactly those keys).

    Vectorized with numpy: a Python loop over every probe of every key cost about 1 µs per
    key, and the compactor runs this for every key it writes, on the writer's GIL. The
    probes are the module docstring's, computed exactly: with ``p = h1 mod n`` and
    ``s = h2 mod n`` (both below ``n = num_bits``), probe ``i + 1`` is ``p_i + s`` less ``n``
    if that reaches ``n``; ``p_i + s < 2n`` never wraps a uint64. Keys are hashed and probed
    ``_CHUNK`` at a time, which bounds the scratch memory and keeps it in cache (a partition
    of a large ``block_size`` can hold a million keys). numpy is imported here, not at
    module level, so that ``import slatepy`` and the CLI do not pay for it.
    """
    import numpy as np

    num_bytes = max(8, (count * bits_per_key + 7) // 8)
    num_bits = num_bytes * 8
    probes = probe_count(bits_per_key)
    n = np.uint64(num_bits)
    flags = np.zeros(num_bits, dtype=np.bool_)
    remaining = iter(keys)
    while digests := b"".join(map(xxhash.xxh3_128_digest, islice(remaining, _CHUNK))):
        # The digests are big-endian: the high 64 bits (h2) come first.
        halves = np.frombuffer(digests, dtype=">u8").reshape(-1, 2)
        rows = np.empty((probes, len(halves)), dtype=np.uint64)
        scratch = np.empty(len(halves), dtype=np.uint64)
        step = (halves[:, 0] | np.uint64(1)) % n
        np.remainder(halves[:, 1], n, out=rows[0])
        for i in range(1, probes):
            row = rows[i]
            np.add(rows[i - 1], step, out=row)
            # row - n wraps to above row unless row >= n, so the minimum is row mod n.
            np.subtract(row, n, out=scratch)
            np.minimum(row, scratch, out=row)
        flags[rows.ravel()] = True
    return bytes((probes,)) + np.packbits(flags, bitorder="little").tobytes()


def key_hash(key: bytes) -> int:
    """The 128-bit hash every filter's probes of ``key`` derive from (the module docstring)."""
    return xxhash.xxh3_128_intdigest(key)


class BloomFilter:
    """A decoded filter answering "maybe present" / "certainly absent"."""

    __slots__ = ("_bits", "_num_bits", "_probes")

    def __init__(self, encoded: bytes) -> None:
        if len(encoded) < 2 or not 1 <= encoded[0] <= 30:
            raise CorruptionError("bloom filter: bad header")
        self._probes = encoded[0]
        self._bits = encoded[1:]
        self._num_bits = len(self._bits) * 8

    def may_contain(self, key: bytes) -> bool:
        """False only if ``key`` was certainly not added."""
        return self.may_contain_hash(xxhash.xxh3_128_intdigest(key))

    def may_contain_hash(self, h: int) -> bool:
        """:meth:`may_contain` of the key whose :func:`key_hash` is ``h``: a caller asking
        many filters about one key (a get over several L0 SSTs) hashes it once."""
        # The probes as build_filter steps them: below num_bits, so the ints stay small
        # (h1 + i * h2 itself outgrows 64 bits, and a big int's every operation costs more).
        num_bits = self._num_bits
        bit = (h & _MASK64) % num_bits
        step = ((h >> 64) | 1) % num_bits
        bits = self._bits
        for _ in range(self._probes):
            if not bits[bit >> 3] >> (bit & 7) & 1:
                return False
            bit += step
            if bit >= num_bits:
                bit -= num_bits
        return True
