"""The torture workload under injected faults, bounded for CI: several seeds per backend,
and a hypothesis state machine over the same operations on memory, file and S3 (moto).

Each run ends by checking, with faults off, that a fresh writer and a fresh reader agree with
the model (and every checkpoint and clone with its own, and the change feed with the writes
made); ``lost_acknowledged_writes`` must be 0 and no invariant may fail on the way
(``Violation`` is raised at the first wrong read).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)

from slatepy.config import Settings
from slatepy.store import ObjectStore, open_store
from slatepy.testing.torture import Torture
from tests.conftest import Backend

Location = Callable[[], tuple[ObjectStore, str | None]]
"""A fresh, empty database location and where its clones go (None: no clones)."""


def locations(backend: Backend) -> Location:
    """Fresh locations on ``backend``: a new ``memory://`` store (which cannot be cloned: a
    clone reopens its source by URL), or a new directory or prefix holding the database and
    its clones."""

    def fresh() -> tuple[ObjectStore, str | None]:
        if backend.name == "memory":
            return open_store("memory://"), None
        root = f"{backend.url.rsplit('/', 1)[0]}/m-{uuid.uuid4().hex[:12]}"
        return open_store(f"{root}/db", backend.settings, create=True), root

    return fresh


RUNS = [("memory", seed, 300) for seed in range(6)] + [
    ("file", 100, 200),
    ("file", 101, 200),
    pytest.param("s3", 200, 120, marks=pytest.mark.s3),
    pytest.param("s3-dynamodb", 300, 60, marks=pytest.mark.s3),
]


@pytest.mark.parametrize(("backend", "seed", "steps"), RUNS, indirect=["backend"])
def test_no_acknowledged_write_is_lost_under_faults(
    backend: Backend, seed: int, steps: int
) -> None:
    store, clone_root = locations(backend)()
    report = Torture(
        store, seed=seed, fault_rate=0.15, settings=backend.settings, clone_root=clone_root
    ).run(steps=steps)
    assert report.lost_acknowledged_writes == 0
    assert report.acknowledged_writes > steps // 4
    assert sum(report.faults.values()) > 0  # faults really were injected
    assert report.crashes > 0
    assert report.checks["checkpoint read"] + report.checks["cdc"] > 0  # the final checks


class TortureMachine(RuleBasedStateMachine):
    """Hypothesis chooses the operation sequence (and shrinks a failing one); the torture
    driver supplies the operations, the faults and the model."""

    torture: Torture

    def __init__(self, location: Location, settings: Settings) -> None:
        super().__init__()
        self.location = location
        self.settings = settings

    @initialize(seed=st.integers(0, 2**16), fault_rate=st.sampled_from([0.0, 0.1, 0.25]))
    def start(self, seed: int, fault_rate: float) -> None:
        store, clone_root = self.location()
        self.torture = Torture(
            store,
            seed=seed,
            fault_rate=fault_rate,
            settings=self.settings,
            clone_root=clone_root,
        )

    @rule()
    def put(self) -> None:
        self.torture.op_put()

    @rule()
    def delete(self) -> None:
        self.torture.op_delete()

    @rule()
    def batch(self) -> None:
        self.torture.op_batch()

    @rule()
    def put_ttl(self) -> None:
        self.torture.op_put_ttl()

    @rule()
    def delete_range(self) -> None:
        self.torture.op_delete_range()

    @rule()
    def merge(self) -> None:
        self.torture.op_merge()

    @rule()
    def ingest(self) -> None:
        self.torture.op_ingest()

    @rule()
    def range_batch(self) -> None:
        self.torture.op_range_batch()

    @rule()
    def tick(self) -> None:
        self.torture.op_tick()

    @rule()
    def flush(self) -> None:
        self.torture.op_flush()

    @rule()
    def get(self) -> None:
        self.torture.op_get()

    @rule()
    def scan(self) -> None:
        self.torture.op_scan()

    @rule()
    def reader(self) -> None:
        self.torture.op_reader()

    @rule()
    def compact(self) -> None:
        self.torture.op_compact()

    @rule()
    def gc(self) -> None:
        self.torture.op_gc()

    @rule()
    def iterate(self) -> None:
        self.torture.op_iterate()

    @rule()
    def transaction(self) -> None:
        self.torture.op_transaction()

    @rule()
    def snapshot(self) -> None:
        self.torture.op_snapshot()

    @rule()
    def snapshot_read(self) -> None:
        self.torture.op_snapshot_read()

    @rule()
    def checkpoint(self) -> None:
        self.torture.op_checkpoint()

    @rule()
    def checkpoint_read(self) -> None:
        self.torture.op_checkpoint_read()

    @rule()
    def checkpoint_drop(self) -> None:
        self.torture.op_checkpoint_drop()

    @rule()
    def clone(self) -> None:
        self.torture.op_clone()

    @rule()
    def clone_read(self) -> None:
        self.torture.op_clone_read()

    @rule()
    def cdc(self) -> None:
        self.torture.op_cdc()

    @rule()
    def crash(self) -> None:
        self.torture.op_crash()

    @rule()
    def reopen(self) -> None:
        self.torture.op_reopen()

    def teardown(self) -> None:
        if hasattr(self, "torture"):
            self.torture.verify()
            self.torture.close_writer()
            assert self.torture.report.lost_acknowledged_writes == 0


MACHINE_RUNS = [
    pytest.param("memory", 20, 40, id="memory"),
    pytest.param("file", 20, 30, id="file"),
    pytest.param("s3", 10, 25, marks=pytest.mark.s3, id="s3"),
]
"""(backend, examples, steps per example): a clone is only possible on file and S3."""


@pytest.mark.parametrize(("backend", "examples", "steps"), MACHINE_RUNS, indirect=["backend"])
def test_state_machine(backend: Backend, examples: int, steps: int) -> None:
    run_state_machine_as_test(
        lambda: TortureMachine(locations(backend), backend.settings),
        settings=hypothesis_settings(
            max_examples=examples, stateful_step_count=steps, deadline=None
        ),
    )
