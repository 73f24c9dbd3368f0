"""Real processes: SIGKILLed writers lose nothing acknowledged; racing writers fence."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from slatepy import Db, Settings
from slatepy.format.sst import decode_sst
from slatepy.store import open_store
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from tests.conftest import Backend, make_backend
from tests.processes import spawn


def settings_dict(settings: Settings) -> dict[str, object]:
    return {name: getattr(settings, name) for name in settings.__struct_fields__}


class Child:
    """A child writer process whose stdout lines are collected by a reader thread."""

    def __init__(self, config: dict[str, object]) -> None:
        self.lines: list[str] = []
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in finish()
        self.proc = spawn(
            "tests.engine.child_writer",
            json.dumps(config),
            stdout=subprocess.PIPE,
            stderr=self.stderr,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def wait_for(self, predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.lines):
                return True
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                return bool(predicate(self.lines))
            time.sleep(0.01)
        return False

    def finish(self, timeout: float = 60) -> list[str]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(timeout=5)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.stderr.close()
        return self.lines

    def error_output(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-3000:]

    def acks(self) -> list[tuple[str, str]]:
        return [tuple(line.split()[1:3]) for line in self.lines if line.startswith("ACK ")]  # type: ignore[misc]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_sigkill_loses_no_acknowledged_write(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    backend = make_backend(name, request, tmp_path)
    rng = random.Random(20261122)
    last_acked: dict[str, int] = {}
    rounds = 4 if name == "file" else 2
    for round_no in range(rounds):
        child = Child(
            {
                "url": backend.url,
                "settings": settings_dict(backend.settings),
                "mode": "crash",
                "seed": round_no,
                "base": (round_no + 1) * 1_000_000,
                "keys": 40,
            }
        )
        acked = child.wait_for(lambda lines: any(x.startswith("ACK") for x in lines), 30)
        assert acked, child.error_output()
        time.sleep(rng.uniform(0.05, 0.6))
        child.proc.send_signal(signal.SIGKILL)
        child.finish()
        for key, value in child.acks():
            last_acked[key] = int(value.split(":")[1])
        with Db.open(backend.url, settings=backend.settings) as db:
            for key, counter in last_acked.items():
                found = db.get(key.encode())
                assert found is not None, f"round {round_no}: acknowledged {key} is missing"
                owner, found_counter = found.decode().split(":")
                assert owner == key
                assert int(found_counter) >= counter, (
                    f"round {round_no}: {key} went back from {counter} to {found_counter}"
                )
    assert len(last_acked) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("name", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_two_processes_racing_to_open(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    backend: Backend = make_backend(name, request, tmp_path)
    Db.open(backend.url, settings=backend.settings).close()  # the database exists

    start_at = time.time() + 4.0  # after both interpreters have imported slatepy

    def spawn(tag: str) -> Child:
        return Child(
            {
                "url": backend.url,
                "settings": settings_dict(backend.settings),
                "mode": "race",
                "tag": tag,
                "start_at": start_at,
                "seconds": 2.5,
            }
        )

    children = {"A": spawn("A"), "B": spawn("B")}
    outcomes = {tag: child.finish() for tag, child in children.items()}
    endings = {tag: lines[-1] for tag, lines in outcomes.items()}
    assert sorted(endings.values()) == ["ALIVE", "FENCED"], outcomes
    survivor = next(tag for tag, end in endings.items() if end == "ALIVE")
    fenced = next(tag for tag, end in endings.items() if end == "FENCED")
    survivor_epoch = int(next(x for x in outcomes[survivor] if x.startswith("OPEN")).split()[1])

    store = open_store(backend.url, backend.settings)
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    epochs = {i: decode_sst(wal.read(i))[0].props.writer_epoch for i in wal.ids()}
    fence_id = min(i for i, epoch in epochs.items() if epoch == survivor_epoch)
    after_fence = {epochs[i] for i in epochs if i > fence_id}
    assert after_fence <= {survivor_epoch}, "a fenced writer's SST appeared after the fence"

    with Db.open(backend.url, settings=backend.settings) as db:
        for tag in (survivor, fenced):
            for key, value in children[tag].acks():
                assert db.get(key.encode()) == value.encode(), f"acknowledged {key} lost"
