"""The torture workload under injected faults, bounded for CI: several seeds per backend.

Each run ends by checking, with faults off, that a fresh writer and a fresh reader agree with
the model; ``lost_acknowledged_writes`` must be 0 and no invariant may fail on the way
(``Violation`` is raised at the first wrong read).
"""

from __future__ import annotations

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from slatepy.store import open_store
from slatepy.testing.torture import Torture
from tests.conftest import Backend

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
    report = Torture(backend.store(), seed=seed, fault_rate=0.15).run(steps=steps)
    assert report.lost_acknowledged_writes == 0
    assert report.acknowledged_writes > steps // 4
    assert sum(report.faults.values()) > 0  # faults really were injected
    assert report.crashes > 0


class TortureMachine(RuleBasedStateMachine):
    """Hypothesis chooses the operation sequence (and shrinks a failing one); the torture
    driver supplies the operations, the faults and the model."""

    torture: Torture

    @initialize(seed=st.integers(0, 2**16), fault_rate=st.sampled_from([0.0, 0.1, 0.25]))
    def start(self, seed: int, fault_rate: float) -> None:
        self.torture = Torture(open_store("memory://"), seed=seed, fault_rate=fault_rate)

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


TortureMachine.TestCase.settings = hypothesis_settings(
    max_examples=20, stateful_step_count=40, deadline=None
)
test_state_machine = TortureMachine.TestCase
