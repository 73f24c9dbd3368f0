"""Helpers for the tests of persist handles: clients over memory and file stores, a fake
clock, and readers of the committed state. Test modules import the fixtures by their
function names (``client_fixture``, ``url_fixture``); tests take them as ``client``/``url``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from slatepy.errors import CorruptionError
from slatepy.persist import PersistClient, PersistSettings
from slatepy.persist.state.records import State
from slatepy.store.metrics import MetricsStore

SHARD = "orders"

TEST_SETTINGS = PersistSettings(
    batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True, small_merge_batches=2
)
"""Short leases; small batches merge in pairs (so that a few appends exercise merges)."""


class Clock:
    """A wall clock tests move by hand (seconds)."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(name="url", params=["memory", "file"])
def url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh location: a memory store, or a directory on disk."""
    return "memory://" if request.param == "memory" else f"file://{tmp_path}"


@pytest.fixture(autouse=True)
def validate_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every state a machine reaches is checked (``State.validate``, ``check_step``)."""
    monkeypatch.setenv("SLATEPY_PERSIST_VALIDATE", "1")


@pytest.fixture(name="client")
def client_fixture(url: str) -> Iterator[PersistClient]:
    with PersistClient.open(url, settings=TEST_SETTINGS) as opened:
        yield opened


def state_of(client: PersistClient, shard: str = SHARD) -> State:
    """The shard's state at the consensus head."""
    return client.machine(shard).fetch()


WRITES = ("put", "delete", "copy", "open_writer")
"""Store requests that change something (``MetricsStore`` kinds)."""


@contextmanager
def nothing_committed(client: PersistClient, shard: str = SHARD) -> Iterator[None]:
    """Assert that the block commits nothing to ``shard``: the consensus head's seqno is
    unchanged, the store lists the same objects (same sizes and ETags), and not one write
    request (PUT, DELETE, COPY, multipart) was sent — a part written and deleted again
    would leave the listing equal but is still a write a usage error must not make."""
    store = client.blob
    assert isinstance(store, MetricsStore)

    def seqno() -> int | str:
        try:
            head = client.consensus.head(shard)
        except CorruptionError as exc:  # the head entry itself is damaged
            return f"unreadable: {exc.path}"
        return 0 if head is None else head.seqno

    def listing() -> dict[str, tuple[int, str | None]]:
        return {meta.path: (meta.size, meta.e_tag) for meta in store.list("")}

    def writes() -> int:
        return sum(store.metrics.requests(kind) for kind in WRITES)

    before = (seqno(), listing(), writes())
    yield
    after = (seqno(), listing(), writes())
    assert after[0] == before[0], f"state changed: seqno {before[0]} -> {after[0]}"
    assert after[1] == before[1], "objects were added, changed or removed"
    assert after[2] == before[2], f"{after[2] - before[2]} write requests were sent"
