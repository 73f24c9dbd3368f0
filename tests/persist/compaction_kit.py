"""Helpers of the compaction, GC and maintenance tests: settings with blob parts, the merge
requests a writer holds in the state, and running them all."""

from __future__ import annotations

from slatepy.persist import PersistClient, PersistSettings
from slatepy.persist.compactor import MergeResult, compact
from slatepy.persist.state.outcome import MergeReq
from slatepy.persist.state.records import State
from tests.persist.handles_kit import SHARD

Update = tuple[tuple[bytes, bytes], int, int]

HOLLOW = PersistSettings(
    batch_lease=10.0,
    consensus_min_age=1.0,
    allow_short_leases=True,
    inline_part_max_bytes=0,
    small_merge_batches=2,
)
"""Every part a blob (so GC has something to collect), short leases, small batches merged
in pairs."""


def upd(key: bytes, time: int, diff: int = 1) -> Update:
    return (key, b"v"), time, diff


def claims(state: State, claimant: str) -> list[MergeReq]:
    """The merges ``claimant`` holds in ``state``, oldest claim first."""
    index = state.batch_index()
    return [
        MergeReq(merge_id, tuple(state.trace[index[i]] for i in claim.inputs))
        for merge_id, claim in sorted(state.merges.items())
        if claim.claimant == claimant
    ]


def compact_all(client: PersistClient, claimant: str, shard: str = SHARD) -> list[MergeResult]:
    """Run every merge ``claimant`` holds, and those the applied ones claim, until none is
    left (bounded)."""
    machine = client.machine(shard)
    results: list[MergeResult] = []
    for _ in range(50):
        pending = claims(machine.fetch(), claimant)
        if not pending:
            return results
        results.append(compact(machine, client._tables, claimant, pending[0]))
    raise AssertionError("merges did not converge")


def snapshot(client: PersistClient, as_of: int, shard: str = SHARD) -> list[Update]:
    reader = client.open_leased_reader(shard)
    try:
        return reader.snapshot(as_of)
    finally:
        reader.expire()


def part_paths(client: PersistClient, shard: str = SHARD) -> set[str]:
    """Keys (relative to the shard) of the part blobs in the store."""
    root = f"shards/{shard}/"
    return {meta.path[len(root) :] for meta in client.blob.list(root + "part/")}


def referenced(state: State) -> set[str]:
    return {key for batch in state.trace for key in batch.part_keys()}


def is_output(key: str) -> bool:
    """Whether ``key`` names a compaction output (``part/{writer}/c{uuid}.sst``; a batch
    part's uuid may start with ``c`` too, but has 32 digits)."""
    name = key.rsplit("/", 1)[-1].removesuffix(".sst")
    return len(name) == 33 and name.startswith("c")


def manual(client: PersistClient) -> PersistClient:
    """``client`` with its background maintenance stopped, if it runs one, so that the test
    alone decides when merges and GC passes run."""
    runner = getattr(client, "_maintenance", None)
    if runner is not None:
        runner.close()
    return client
