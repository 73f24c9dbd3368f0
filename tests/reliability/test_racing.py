"""Racing writers and readers, some killed mid-protocol, over a failing, slow store."""

from __future__ import annotations

import pytest

from slatepy.testing.racing import RacingRounds
from tests.conftest import Backend

RUNS = [
    ("memory", 1, (1,), 0.6),
    ("memory", 2, (1, 1, 2, 4), 0.6),
    ("memory", 3, (1, 2, 4, 8), 0.6),
    ("file", 4, (1, 1, 2, 4), 0.6),
    pytest.param("s3", 5, (1, 2, 4), 2.0, marks=pytest.mark.s3),
]


@pytest.mark.parametrize(("backend", "seed", "widths", "seconds"), RUNS, indirect=["backend"])
def test_racing_writers_and_readers_lose_nothing_acknowledged(
    backend: Backend, seed: int, widths: tuple[int, ...], seconds: float
) -> None:
    rounds = RacingRounds(backend.store(), seed=seed, widths=widths, round_seconds=seconds)
    stats = rounds.run(6)
    # The workload really raced: writers opened, got fenced or killed, and acknowledged.
    assert stats["opened"] >= 4 and stats["acknowledged"] >= 20, stats
    assert stats["fenced"] + stats["killed"] >= 4, stats
