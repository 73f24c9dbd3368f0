"""Manifest encoding: round trips and corrupt bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slatepy.errors import CorruptionError
from slatepy.manifest import Manifest, Snapshot, SortedRun, SstHandle

u64 = st.integers(0, 2**64 - 1)
handles = st.builds(
    SstHandle,
    id=st.text(min_size=1, max_size=30),
    object_size=u64,
    first_key=st.binary(max_size=20),
    last_key=st.binary(max_size=20),
    entry_count=u64,
)
manifests = st.builds(
    lambda we, ce, compacted, extra, l0, runs, snaps: Manifest(
        writer_epoch=we,
        compactor_epoch=ce,
        wal_id_last_compacted=compacted,
        wal_id_last_seen=compacted + extra,
        l0=tuple(l0),
        sorted_runs=tuple(runs),
        snapshots=tuple(snaps),
    ),
    u64,
    u64,
    st.integers(0, 2**62),
    st.integers(0, 2**62),
    st.lists(handles, max_size=4),
    st.lists(
        st.builds(SortedRun, id=u64, ssts=st.lists(handles, max_size=3).map(tuple)), max_size=3
    ),
    st.lists(
        st.builds(Snapshot, id=st.text(max_size=36), manifest_id=u64, expire_time_s=u64), max_size=4
    ),
)


@given(manifests)
def test_manifest_round_trip(manifest: Manifest) -> None:
    assert Manifest.decode(manifest.encode()) == manifest


def test_flipping_any_byte_of_a_manifest_is_detected() -> None:
    manifest = Manifest(
        writer_epoch=3,
        compactor_epoch=1,
        wal_id_last_compacted=10,
        wal_id_last_seen=12,
        l0=(SstHandle("a", 100, b"a", b"z", 5),),
        snapshots=(Snapshot("s", 4, 0),),
    )
    data = manifest.encode()
    for position in range(len(data)):
        for bit in (0, 7):
            corrupt = bytearray(data)
            corrupt[position] ^= 1 << bit
            with pytest.raises(CorruptionError):
                Manifest.decode(bytes(corrupt))


@given(st.binary(max_size=200))
def test_random_bytes_are_not_a_manifest(data: bytes) -> None:
    with pytest.raises(CorruptionError):
        Manifest.decode(data)


def test_inconsistent_wal_ids_are_rejected() -> None:
    bad = Manifest(wal_id_last_compacted=5, wal_id_last_seen=4)
    with pytest.raises(CorruptionError):
        Manifest.decode(bad.encode())
