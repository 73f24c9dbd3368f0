"""Damaged databases built by hand for the corruption and doctor tests (RFC 0012).

Each builder writes acknowledged (awaited) puts to a ``file://`` database, damages one object
the way a disk or an operator would, and says what a repair must keep: ``survivors`` is the
exact expected state after ``doctor --repair`` (None = the key is gone), ``given_up`` the
objects its report must name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from slatepy import Db, Settings
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.manifest.store import MANIFEST_DIR, MANIFEST_SUFFIX, ManifestStore
from slatepy.store import open_store
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX, compacted_path

OFF = Settings(compactor="off")  # the tests decide when compaction happens


@dataclass
class Damaged:
    """A damaged database and what a repair must leave of it."""

    kind: str
    root: Path
    damaged: str
    """The damaged object, relative to the database root."""
    survivors: dict[bytes, bytes | None]
    given_up: list[str] = field(default_factory=list)
    opens: bool = False
    """Whether ``Db.open`` still works (only reads that reach the object fail)."""

    @property
    def url(self) -> str:
        return f"file://{self.root}"


def key(i: int) -> bytes:
    return b"k%03d" % i


def wal_path(wal_id: int) -> str:
    return NumberedObjects(open_store("memory://"), WAL_DIR, WAL_SUFFIX).path(wal_id)


def manifest_path(manifest_id: int) -> str:
    return NumberedObjects(open_store("memory://"), MANIFEST_DIR, MANIFEST_SUFFIX).path(manifest_id)


def put_all(url: str, pairs: dict[bytes, bytes]) -> None:
    """One awaited put each: one WAL SST per put, after the open's fencing SST."""
    with Db.open(url, settings=OFF) as db:
        for k, v in pairs.items():
            db.put(k, v)


def flip(root: Path, relative: str, offset: int = 10) -> None:
    """Flip one byte (by default inside the first data block)."""
    path = root / relative
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def compact(url: str, *, policy: CompactionPolicy | None = None) -> None:
    Compactor(open_store(url), settings=OFF, policy=policy).run_until_idle()


def only_compacted(root: Path, before: set[str] | None = None) -> str:
    names = set(os.listdir(root / "compacted")) - (before or set())
    assert len(names) == 1, names
    return f"compacted/{names.pop()}"


def flipped_wal(root: Path) -> Damaged:
    """Eight puts, one WAL SST each (ids 2..9); the SST of the fourth put (id 5) is damaged.

    A WAL is a prefix: the repair keeps ids 2..4 and gives up 5..9 (the intact ones too).
    """
    url = f"file://{root}"
    pairs = {key(i): b"v%d" % i for i in range(8)}
    put_all(url, pairs)
    flip(root, wal_path(5))
    survivors = {k: (v if i < 3 else None) for i, (k, v) in enumerate(pairs.items())}
    return Damaged("WAL SST", root, wal_path(5), survivors, [wal_path(i) for i in range(5, 10)])


def missing_wal(root: Path) -> Damaged:
    """As :func:`flipped_wal`, but WAL SST 5 is deleted (lost below later SSTs)."""
    damaged = flipped_wal(root)
    (root / wal_path(5)).unlink()
    damaged.kind = "missing WAL SST"
    return damaged


def flipped_l0(root: Path) -> Damaged:
    """k000..k005 compacted into one L0 SST, then k004 overwritten and k006 added in the WAL;
    the L0 SST is damaged. Dropping it loses k000..k003 and k005 (k004's newer value stays)."""
    url = f"file://{root}"
    put_all(url, {key(i): b"old%d" % i for i in range(6)})
    compact(url)
    sst = only_compacted(root)
    put_all(url, {key(4): b"new4", key(6): b"new6"})
    flip(root, sst)
    survivors: dict[bytes, bytes | None] = {key(i): None for i in range(6)}
    survivors |= {key(4): b"new4", key(6): b"new6"}
    return Damaged("L0 SST", root, sst, survivors, [sst], opens=True)


def missing_l0(root: Path) -> Damaged:
    """As :func:`flipped_l0`, but the L0 SST is deleted."""
    damaged = flipped_l0(root)
    (root / damaged.damaged).unlink()
    damaged.kind = "missing L0 SST"
    return damaged


def flipped_run(root: Path) -> Damaged:
    """k000..k005 compacted down into a sorted run; then k002 overwritten and k007 added,
    compacted into L0; the sorted run's SST is damaged. Dropping it loses k000, k001 and
    k003..k005; k002's newer value and k007 (in L0) stay."""
    url = f"file://{root}"
    put_all(url, {key(i): b"old%d" % i for i in range(6)})
    compact(url, policy=CompactionPolicy(l0_trigger=1))
    stored = ManifestStore(open_store(url)).load()
    assert stored is not None and not stored.manifest.l0 and len(stored.manifest.sorted_runs) == 1
    run_sst = compacted_path(stored.manifest.sorted_runs[0].ssts[0].id)
    put_all(url, {key(2): b"new2", key(7): b"new7"})
    compact(url)
    flip(root, run_sst)
    survivors: dict[bytes, bytes | None] = {key(i): None for i in range(6)}
    survivors |= {key(2): b"new2", key(7): b"new7"}
    return Damaged("compacted (sorted run) SST", root, run_sst, survivors, [run_sst], opens=True)


def truncated_manifest(root: Path) -> Damaged:
    """Writes, then a compaction publishes manifest N (WAL into L0), which is truncated.

    The repair falls back to manifest N-1, whose WAL is all still there (GC has not run), so
    every acknowledged write survives; the report names manifest N as given up and the L0
    SST it had published as unreferenced."""
    url = f"file://{root}"
    pairs = {key(i): b"v%d" % i for i in range(4)}
    put_all(url, pairs)
    compact(url)
    latest = ManifestStore(open_store(url)).latest_id()
    assert latest is not None
    path = root / manifest_path(latest)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    sst = only_compacted(root)
    return Damaged(
        "truncated latest manifest",
        root,
        manifest_path(latest),
        dict(pairs),
        [manifest_path(latest), sst],
    )


BUILDERS = {
    "wal": flipped_wal,
    "l0": flipped_l0,
    "run": flipped_run,
    "manifest": truncated_manifest,
    "missing-wal": missing_wal,
    "missing-l0": missing_l0,
}


def slatedb_like(root: Path) -> None:
    """A directory laid out as SlateDB lays out a database: ``manifest/{id:020}.manifest``
    (a 2-byte version, then a flatbuffer), ``wal/{id:020}.sst`` and ``compacted/{ulid}.sst``,
    none of it in slatepy's formats."""
    (root / "manifest").mkdir(parents=True)
    (root / "wal").mkdir()
    (root / "compacted").mkdir()
    flatbuffer = b"\x00\x01" + b"\x10\x00\x00\x00\x0c\x00\x14\x00" + bytes(range(40))
    for i in (1, 2):
        (root / manifest_path(i)).write_bytes(flatbuffer + bytes([i]))
    (root / wal_path(1)).write_bytes(b"\x00" * 64 + b"\x01\x00")
    (root / "compacted" / "01HZXJ5N9J3V0Q8W9Y2Z7K4M6P.sst").write_bytes(b"\x02" * 128)


def listing(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (to prove nothing changed)."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }
