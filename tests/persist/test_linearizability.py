"""Linearizability of ``compare_and_append`` across processes under faults (issue 13).

Three processes race on one shard of a file store, each appending operations at the upper it
just fetched, through a blob store and a consensus that both fail on purpose at 10% (refused,
lost on the way, acted with the reply lost). Afterwards, with no faults, the shard is read
back with its original times: the successful calls form one chain of uppers (each time in
``[1, upper)`` holds exactly one operation, the acknowledged ones at the upper they were
told), every acknowledged operation is there exactly once, an uncertain one at most once, and
nothing else is.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from slatepy.persist import PersistClient, Progress, Updates
from tests.persist.linearizability_child import updates
from tests.processes import spawn

PROCESSES = 3
OPS = 40
RATE = 0.10


def test_racing_processes_under_faults_form_one_chain(tmp_path: Path) -> None:
    root = tmp_path / "persist"
    root.mkdir()
    url = f"file://{root}"
    with PersistClient.open(url) as client:  # data starts at time 1
        client.open_writer("race").compare_and_append([], expected_upper=0, new_upper=1)
    outs = [tmp_path / f"writer{pid}.json" for pid in range(PROCESSES)]
    logs = [tmp_path / f"writer{pid}.log" for pid in range(PROCESSES)]
    children = []
    for pid in range(PROCESSES):
        with logs[pid].open("w") as log:
            args = (url, str(pid), str(OPS), str(100 + pid), str(RATE), str(outs[pid]))
            children.append(spawn("tests.persist.linearizability_child", *args, stderr=log))
    for pid, child in enumerate(children):
        assert child.wait(timeout=240) == 0, logs[pid].read_text()[-3000:]
    reports = [json.loads(out.read_text()) for out in outs]

    with PersistClient.open(url) as client:
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
    assert acked + uncertain == PROCESSES * OPS and acked >= PROCESSES * OPS // 2
    assert faults > 0
    print(
        f"{PROCESSES} processes x {OPS} operations: {acked} acknowledged, {uncertain} "
        f"uncertain, {faults} faults injected, final upper {upper}"
    )


def _owner(key: bytes) -> tuple[int, int]:
    pid, n = key[1:].split(b"-")[:2]
    return int(pid), int(n)
