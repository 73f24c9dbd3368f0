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

import xxhash

from slatepy.errors import CorruptionError

_MASK64 = (1 << 64) - 1


def probe_count(bits_per_key: int) -> int:
    """Optimal probe count for a bits-per-key budget (``ln 2 * bits``), kept in [1, 30]."""
    return max(1, min(30, round(bits_per_key * math.log(2))))


def build_filter(keys: Iterable[bytes], count: int, bits_per_key: int) -> bytes:
    """Encode a filter for ``count`` keys (``keys`` yields exactly those keys)."""
    num_bytes = max(8, (count * bits_per_key + 7) // 8)
    num_bits = num_bytes * 8
    probes = probe_count(bits_per_key)
    bits = bytearray(num_bytes)
    digest = xxhash.xxh3_128_intdigest
    for key in keys:
        h = digest(key)
        h1 = h & _MASK64
        h2 = (h >> 64) | 1
        for _ in range(probes):
            bit = h1 % num_bits
            bits[bit >> 3] |= 1 << (bit & 7)
            h1 += h2
    return bytes((probes,)) + bytes(bits)


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
        h = xxhash.xxh3_128_intdigest(key)
        h1 = h & _MASK64
        h2 = (h >> 64) | 1
        bits, num_bits = self._bits, self._num_bits
        for _ in range(self._probes):
            bit = h1 % num_bits
            if not bits[bit >> 3] & (1 << (bit & 7)):
                return False
            h1 += h2
        return True
