"""Merge operators (RFC 0019): operands fold on reads, in readers (also in another process)
and in compaction, partially until a base or the bottom is known."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slatepy import Db, DbReader, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.errors import InvalidArgument
from slatepy.format.block import BlockBuilder, decode_block
from slatepy.format.kinds import Operands
from slatepy.format.sst import decode_sst
from slatepy.manifest.store import ManifestStore
from slatepy.store.url import open_store
from slatepy.table.layout import compacted_path

FAST = Settings(flush_interval=60, compactor="off", gc_min_age=3600)
ONE = CompactionPolicy(l0_trigger=1)


def add(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    """A counter: the existing value plus every operand, as decimal text."""
    return b"%d" % (int(existing or b"0") + sum(int(op) for op in operands))


def test_operands_round_trip_through_a_block() -> None:
    builder = BlockBuilder()
    builder.add(b"k", 1, Operands.of([b"1", b"", b"22"]))
    value = decode_block(builder.finish()).values[0]
    assert isinstance(value, Operands) and value.operands() == [b"1", b"", b"22"]


def test_merge_needs_an_operator() -> None:
    with Db.open("memory://", settings=FAST) as db:
        with pytest.raises(InvalidArgument, match="merge_operator"):
            db.merge(b"k", b"1")
        with pytest.raises(InvalidArgument, match="merge operator"):
            db.write(WriteBatch().merge(b"k", b"1"))


def test_merges_fold_on_get_get_many_and_scan() -> None:
    with Db.open("memory://", settings=FAST, merge_operator=add) as db:
        db.merge(b"c", b"1")
        db.merge(b"c", b"2")
        db.put(b"p", b"10")
        db.merge(b"p", b"5")
        db.write(WriteBatch().merge(b"q", b"3").merge(b"q", b"4").put(b"x", b"y"))
        assert db.get(b"c") == b"3" and db.get(b"p") == b"15" and db.get(b"q") == b"7"
        assert db.get_many([b"c", b"p", b"q", b"none"]) == [b"3", b"15", b"7", None]
        assert dict(db.scan()) == {b"c": b"3", b"p": b"15", b"q": b"7", b"x": b"y"}
        db.delete(b"c")
        db.merge(b"c", b"100")
        db.delete_range(b"p", b"q")
        db.merge(b"p", b"1")
        assert db.get(b"c") == b"100" and db.get(b"p") == b"1"


def test_a_bad_operator_result_is_invalid() -> None:
    with Db.open("memory://", settings=FAST, merge_operator=lambda k, e, ops: 5) as db:  # type: ignore[arg-type, return-value]
        db.merge(b"k", b"1")
        with pytest.raises(InvalidArgument, match="must return bytes"):
            db.get(b"k")


def _sst_values(url: str) -> list[bytes | None]:
    store = open_store(url, FAST)
    stored = ManifestStore(store).load()
    assert stored is not None
    handles = [*stored.manifest.l0, *(h for r in stored.manifest.sorted_runs for h in r.ssts)]
    return [v for h in handles for _, _, v in decode_sst(store.get(compacted_path(h.id)))[1]]


def test_merges_across_compaction_and_reopen(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=FAST, merge_operator=add) as db:
        db.merge(b"n", b"1")
        db.merge(b"n", b"2")
    compactor = Compactor(open_store(url, FAST), settings=FAST, policy=ONE, merge_operator=add)
    compactor.run_once()  # WAL -> L0: no base known, so the operands stay operands
    assert [type(v) for v in _sst_values(url)] == [Operands]
    with Db.open(url, settings=FAST, merge_operator=add) as db:
        assert db.get(b"n") == b"3"
        db.merge(b"n", b"10")
        assert db.get(b"n") == b"13" and dict(db.scan()) == {b"n": b"13"}
    compactor.run_until_idle()  # down to the bottom: one plain value
    assert _sst_values(url) == [b"13"] and type(_sst_values(url)[0]) is bytes
    with Db.open(url, settings=FAST, merge_operator=add) as db:
        assert db.get(b"n") == b"13"
        db.merge(b"n", b"1")  # over a compacted base
        assert db.get(b"n") == b"14"
    compactor.run_until_idle()
    assert _sst_values(url) == [b"14"]


def test_a_compactor_without_the_operator_cannot_fold_over_a_value(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=FAST, merge_operator=add) as db:
        db.put(b"n", b"1")
    Compactor(open_store(url, FAST), settings=FAST, policy=ONE).run_until_idle()
    with Db.open(url, settings=FAST, merge_operator=add) as db:
        db.merge(b"n", b"1")
    with pytest.raises(InvalidArgument, match="merge_operator"):
        Compactor(open_store(url, FAST), settings=FAST, policy=ONE).run_until_idle()


_CHILD = """
import json, sys
from slatepy import DbReader, Settings
from tests.engine.test_merge import add
reader = DbReader.open(sys.argv[1], settings=Settings(gc_min_age=3600), read_only=True,
                       merge_operator=add)
try:
    print(json.dumps({k.decode(): v.decode() for k, v in reader.scan()}))
finally:
    reader.close()
"""


@pytest.mark.parametrize("compacted", [False, True])
def test_readers_fold_merges(tmp_path: Path, compacted: bool) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=FAST, merge_operator=add) as db:
        db.put(b"a", b"5")
        db.merge(b"a", b"1")
        db.merge(b"b", b"2")
        if compacted:
            db.flush()
            Compactor(
                open_store(url, FAST), settings=FAST, policy=ONE, merge_operator=add
            ).run_once()
        db.merge(b"a", b"10")
        db.merge(b"b", b"3")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    assert json.loads(out.stdout) == {"a": "16", "b": "5"}
    with DbReader.open(url, settings=FAST, read_only=True, merge_operator=add) as reader:
        assert reader.get(b"a") == b"16" and reader.get_many([b"b"]) == [b"5"]
    with (
        DbReader.open(url, settings=FAST, read_only=True) as reader,
        pytest.raises(InvalidArgument, match="merge_operator"),
    ):
        reader.get(b"a")


def test_operands_over_a_ttl_value_keep_its_expiry() -> None:
    now = [1_700_000_000.0]
    with Db.open("memory://", settings=FAST, merge_operator=add, clock=lambda: now[0]) as db:
        db.put(b"k", b"1", ttl=10)
        db.merge(b"k", b"1")
        assert db.get(b"k") == b"2"
        now[0] += 10
        assert db.get(b"k") is None
        db.merge(b"k", b"7")  # over an expired value: over nothing
        assert db.get(b"k") == b"7"


def test_slatepy_compact_takes_the_merge_operator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from slatepy.cli.main import main

    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=FAST, merge_operator=add) as db:
        db.put(b"n", b"1")  # a WAL SST each: compacting them folds the operand over "1"
        db.merge(b"n", b"41")
    assert main(["compact", url, "--merge-operator", "nowhere:add"]) != 0
    assert "does not import" in capsys.readouterr().err
    assert main(["compact", url]) != 0
    assert "merge_operator" in capsys.readouterr().err
    assert main(["compact", url, "--force", "--merge-operator", "tests.engine.test_merge:add"]) == 0
    assert _sst_values(url) == [b"42"]
