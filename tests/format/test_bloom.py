"""The vectorized bloom filter build writes exactly the bytes of the format's definition.

``reference_filter`` is the per-probe Python loop that built filters before the build used
numpy; it follows RFC 0002 word for word (Python ints, so ``h1 + i * h2`` never wraps), and
every filter ``build_filter`` writes must equal its output byte for byte.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from slatepy.format.bloom import _CHUNK, BloomFilter, build_filter, probe_count

_MASK64 = (1 << 64) - 1


def reference_filter(keys: Iterable[bytes], count: int, bits_per_key: int) -> bytes:
    """The filter of RFC 0002, computed one probe at a time with Python ints."""
    num_bytes = max(8, (count * bits_per_key + 7) // 8)
    num_bits = num_bytes * 8
    probes = probe_count(bits_per_key)
    bits = bytearray(num_bytes)
    for key in keys:
        h = xxhash.xxh3_128_intdigest(key)
        h1 = h & _MASK64
        h2 = (h >> 64) | 1
        for _ in range(probes):
            bit = h1 % num_bits
            bits[bit >> 3] |= 1 << (bit & 7)
            h1 += h2
    return bytes((probes,)) + bytes(bits)


def random_keys(rng: random.Random, count: int) -> list[bytes]:
    """Keys of many lengths: empty, short, typical, and a few long ones."""
    lengths = [0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 240, 1000, 5000]
    return [
        rng.randbytes(rng.choice(lengths) if rng.random() < 0.2 else rng.randint(1, 48))
        for _ in range(count)
    ]


@settings(max_examples=300)
@given(
    keys=st.lists(st.binary(max_size=80), max_size=200),
    bits_per_key=st.integers(1, 64),
)
def test_build_matches_the_reference(keys: list[bytes], bits_per_key: int) -> None:
    assert build_filter(keys, len(keys), bits_per_key) == reference_filter(
        keys, len(keys), bits_per_key
    )


@pytest.mark.parametrize("count", [0, 1, 2, 3, 50, 4000])
@pytest.mark.parametrize("bits_per_key", [*range(1, 31), 40, 64])
def test_build_matches_the_reference_for_every_probe_count(count: int, bits_per_key: int) -> None:
    keys = random_keys(random.Random(count * 100 + bits_per_key), count)
    assert build_filter(keys, count, bits_per_key) == reference_filter(keys, count, bits_per_key)


@pytest.mark.parametrize("count", [_CHUNK - 1, _CHUNK, _CHUNK + 1, 3 * _CHUNK + 5])
def test_build_matches_the_reference_across_chunks(count: int) -> None:
    """build_filter hashes ``_CHUNK`` keys at a time: every chunk, the last one partial."""
    keys = random_keys(random.Random(count), count)
    assert build_filter(keys, count, 10) == reference_filter(keys, count, 10)


def test_probes_past_two_to_the_64_do_not_wrap() -> None:
    """Most keys have ``h1 + i * h2 >= 2**64`` for some probe: a build in wrapping uint64
    arithmetic would set other bits, so the comparisons above would catch it."""
    keys = random_keys(random.Random(3), 1000)
    probes = probe_count(10)
    past = sum(
        (h & _MASK64) + (probes - 1) * ((h >> 64) | 1) >= 1 << 64
        for h in map(xxhash.xxh3_128_intdigest, keys)
    )
    assert past > 900

    def wrapping(keys: list[bytes], count: int) -> bytes:
        num_bits = max(8, (count * 10 + 7) // 8) * 8
        bits = bytearray(num_bits // 8)
        for h in map(xxhash.xxh3_128_intdigest, keys):
            h1, h2 = h & _MASK64, (h >> 64) | 1
            for _ in range(probes):
                bit = h1 % num_bits
                bits[bit >> 3] |= 1 << (bit & 7)
                h1 = (h1 + h2) & _MASK64
        return bytes((probes,)) + bytes(bits)

    assert wrapping(keys, len(keys)) != build_filter(keys, len(keys), 10)


@pytest.mark.parametrize("bits_per_key", [1, 5, 10, 30, 64])
def test_lookups_probe_the_bits_of_the_reference(bits_per_key: int) -> None:
    """``may_contain`` steps its probes below ``num_bits`` (small ints): every answer, for
    keys added and keys not, is the reference's (Python ints, ``h1 + i * h2`` unbounded)."""
    rng = random.Random(bits_per_key)
    keys = random_keys(rng, 300)
    encoded = reference_filter(keys, len(keys), bits_per_key)
    num_bits = 8 * (len(encoded) - 1)

    def reference_may_contain(key: bytes) -> bool:
        h = xxhash.xxh3_128_intdigest(key)
        h1, h2 = h & _MASK64, (h >> 64) | 1
        for _ in range(encoded[0]):
            bit = h1 % num_bits
            if not encoded[1 + (bit >> 3)] & (1 << (bit & 7)):
                return False
            h1 += h2
        return True

    probes = keys + random_keys(rng, 3000)
    answers = list(map(BloomFilter(encoded).may_contain, probes))
    assert answers == list(map(reference_may_contain, probes))
    assert all(answers[:300]) and not all(answers[300:])


def test_build_accepts_any_iterable() -> None:
    keys = random_keys(random.Random(11), 500)

    def generate() -> Iterator[bytes]:
        yield from keys

    expected = reference_filter(keys, len(keys), 10)
    assert build_filter(generate(), len(keys), 10) == expected
    assert build_filter(tuple(keys), len(keys), 10) == expected
    assert build_filter(iter(keys), len(keys), 10) == expected


def test_false_positive_rate_at_ten_bits_per_key() -> None:
    present = [os.urandom(16) for _ in range(20_000)]
    bloom = BloomFilter(build_filter(present, len(present), 10))
    assert all(bloom.may_contain(k) for k in present)
    absent = [b"absent-%d" % i for i in range(20_000)]
    rate = sum(map(bloom.may_contain, absent)) / len(absent)
    assert 0.002 < rate < 0.015  # about 0.8% at 10 bits/key and 7 probes


def test_importing_slatepy_does_not_import_numpy() -> None:
    """numpy costs ~0.1 s to import: only building a filter may pay for it."""
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, slatepy, slatepy.format.bloom, slatepy.format.sst, slatepy.cli.main\n"
        "assert 'numpy' not in sys.modules\n"
        "from slatepy.format.bloom import build_filter\n"
        "build_filter([b'k'], 1, 10)\n"
        "assert 'numpy' in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=root)
