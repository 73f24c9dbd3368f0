"""Linearizability of ``compare_and_append`` across processes under faults, with GC deleting
while they race (RFC 0015 §13.4, issue 27).

Four processes race on one shard, each appending 200 operations at the upper it just
fetched, through a blob store and a consensus that both fail on purpose at 10% (refused,
lost on the way, acted with the reply lost); every client compacts and collects garbage in
the background with ``batch_lease`` 2 s, so merge inputs, rollups and consensus entries are
deleted during the run. Locations: a file store (object-store consensus on it), S3 on moto
(the same), and a file store with PostgreSQL consensus. Afterwards, with no faults, the
shard is read back with its original times: the successful calls form one chain of uppers
(each time in ``[1, upper)`` holds exactly one operation, the acknowledged ones at the upper
they were told), every acknowledged operation is there exactly once, an uncertain one at
most once, and nothing else is.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slatepy.config import Settings
from slatepy.persist import PersistClient, Progress, Updates
from slatepy.persist.location.open import open_consensus
from slatepy.store.stack import open_stack
from tests.conftest import TEST_BUCKET, s3_settings
from tests.persist.linearizability_child import updates
from tests.processes import spawn

PROCESSES = 4
OPS = 200
RATE_PCT = 10


@pytest.mark.slow
@pytest.mark.parametrize(
    "location", ["file", pytest.param("s3", marks=pytest.mark.s3), "postgresql"]
)
def test_racing_processes_under_faults_and_gc_form_one_chain(
    location: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    config = _location(location, tmp_path, request)
    with _client(config) as client:  # data starts at time 1
        client.open_writer("race").compare_and_append([], expected_upper=0, new_upper=1)
    outs = [tmp_path / f"writer{pid}.json" for pid in range(PROCESSES)]
    logs = [tmp_path / f"writer{pid}.log" for pid in range(PROCESSES)]
    children = []
    start = time.monotonic()
    for pid in range(PROCESSES):
        with logs[pid].open("w") as log:
            args = config | {"pid": pid, "ops": OPS, "seed": 100 + pid, "rate_pct": RATE_PCT}
            args["out"] = str(outs[pid])
            children.append(
                spawn("tests.persist.linearizability_child", json.dumps(args), stderr=log)
            )
    for pid, child in enumerate(children):
        assert child.wait(timeout=600) == 0, logs[pid].read_text()[-3000:]
    elapsed = time.monotonic() - start
    reports = [json.loads(out.read_text()) for out in outs]

    with _client(config) as client:
        upper = client.open_writer("race").fetch_recent_upper()
        assert upper is not None
        listen = client.open_leased_reader("race").listen(0)
        at: dict[int, Counter[bytes]] = {}
        frontier = 1
        for _ in range(1000):
            for event in listen.fetch_next(timeout=5.0):
                if isinstance(event, Updates):
                    for (key, _), t, diff in event.updates:
                        at.setdefault(t, Counter())[key] += diff
                elif isinstance(event, Progress):
                    assert event.upper is not None
                    frontier = event.upper
            if frontier >= upper:
                break
        listen.close()

    expected = {
        (pid, n): Counter(k for (k, _), _, _ in updates(pid, n, 0))
        for pid in range(PROCESSES)
        for n in range(OPS)
    }
    seen: dict[tuple[int, int], int] = {}
    for t in range(1, upper):
        owners = {_owner(key) for key in at.get(t, Counter())}
        assert len(owners) == 1, f"time {t} holds {owners or 'nothing'}: not one chain"
        (op,) = owners
        assert at[t] == expected[op], f"operation {op} at {t} is not whole or is duplicated"
        assert op not in seen, f"operation {op} appended twice, at {seen[op]} and {t}"
        seen[op] = t
    assert set(at) <= set(range(1, upper))
    acked = uncertain = 0
    for pid, report in enumerate(reports):
        for n, appended_at in report["acked"]:
            assert seen.get((pid, n)) == appended_at, f"acknowledged ({pid}, {n}) not at its upper"
            acked += 1
        uncertain += len(report["uncertain"])
        landed = {op for op in seen if op[0] == pid}
        assert landed <= {(pid, n) for n, _ in report["acked"]} | {
            (pid, n) for n in report["uncertain"]
        }
    faults = sum(sum(r["faults"].values()) for r in reports)
    gc = sum((Counter(r["gc"]) for r in reports), Counter[str]())
    assert acked + uncertain == PROCESSES * OPS and acked >= PROCESSES * OPS // 2
    assert faults > 0
    print(
        f"{location}: {PROCESSES} processes x {OPS} operations in {elapsed:.1f} s: {acked} "
        f"acknowledged, {uncertain} uncertain, {faults} faults injected, final upper "
        f"{upper}; GC during the run deleted {gc['parts']} parts and {gc['rollups']} "
        f"rollups ({gc['passes']} passes completed, {gc['truncations']} truncating); "
        f"{sum(r['lost'] for r in reports)} lost races; seconds appending / draining "
        f"maintenance per child: {[[round(x, 1) for x in r['seconds']] for r in reports]}"
    )
    assert gc["parts"] > 0, f"GC deleted no part during the run: {dict(gc)}"


def _location(location: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    """The child's view of a location: blob URL and store settings (as a dict), consensus."""
    config: dict[str, Any] = {"store_settings": {}, "consensus": None, "table": None}
    if location == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        settings = s3_settings(endpoint)
        config["url"] = f"s3://{TEST_BUCKET}/lin-{uuid.uuid4().hex[:12]}"
        config["store_settings"] = {
            "s3_endpoint": settings.s3_endpoint,
            "s3_region": settings.s3_region,
            "s3_access_key_id": settings.s3_access_key_id,
            "s3_secret_access_key": settings.s3_secret_access_key,
            "s3_allow_http": settings.s3_allow_http,
        }
        return config
    root = tmp_path / "persist"
    root.mkdir()
    config["url"] = f"file://{root}"
    if location == "postgresql":
        config["consensus"] = request.getfixturevalue("postgres").url()
        config["table"] = f"consensus_{uuid.uuid4().hex[:16]}"
    return config


@contextlib.contextmanager
def _client(config: dict[str, Any]) -> Iterator[PersistClient]:
    """A client of the location without faults (to set up and to check)."""
    stack = open_stack(config["url"], Settings.from_dict(config["store_settings"]))
    pg = config["consensus"]
    consensus = open_consensus(stack, pg, table=config["table"]) if pg else None
    try:
        with PersistClient.open(stack, consensus=consensus) as client:
            yield client
    finally:
        if consensus is not None:
            consensus.close()


def _owner(key: bytes) -> tuple[int, int]:
    pid, n = key[1:].split(b"-")[:2]
    return int(pid), int(n)
