"""Manifest format versions: version 2 encodes SST handles and runs as arrays; a database
whose manifest is version 1 (maps) opens, reads, and its next update writes version 2."""

from __future__ import annotations

import msgspec

from slatepy import Db, Settings
from slatepy.compactor import Compactor
from slatepy.format.envelope import seal
from slatepy.manifest import Manifest, ManifestStore
from slatepy.manifest.record import MANIFEST_FORMAT_VERSION, MANIFEST_MAGIC, SstHandle
from slatepy.store import open_store


def as_version_1(manifest: Manifest) -> bytes:
    """``manifest`` as format version 1 wrote it: every struct a map of its fields."""
    return seal(MANIFEST_MAGIC, 1, msgspec.msgpack.encode(version_1_fields(manifest)))


def version_1_fields(manifest: Manifest) -> dict[str, object]:
    """``manifest``'s fields as format version 1 encoded them (maps), before sealing: a test
    of an older slatepy's manifest removes the fields that slatepy did not know yet."""

    def handle(h: SstHandle) -> dict[str, object]:
        return {f: getattr(h, f) for f in h.__struct_fields__}

    fields = msgspec.structs.asdict(manifest)
    fields["format_version"] = 1
    fields["l0"] = [handle(h) for h in manifest.l0]
    fields["sorted_runs"] = [
        {"id": run.id, "ssts": [handle(h) for h in run.ssts]} for run in manifest.sorted_runs
    ]
    return fields


def test_version_2_writes_handles_as_arrays_and_is_smaller() -> None:
    handle = SstHandle("a" * 32, 1000, b"k1", b"k9", 10, max_seq=7)
    manifest = Manifest(l0=(handle,) * 100)
    encoded = manifest.encode()
    assert int.from_bytes(encoded[4:6], "little") == MANIFEST_FORMAT_VERSION == 2
    assert Manifest.decode(encoded) == manifest
    assert len(encoded) < 0.7 * len(as_version_1(manifest))


def test_a_version_1_database_opens_reads_and_is_rewritten_as_version_2() -> None:
    store = open_store("memory://")
    settings = Settings(compactor="off")
    with Db.open(store, settings=settings) as db:
        for i in range(200):
            db.put(b"key%04d" % i, b"v%d" % i)
    Compactor(store).run_until_idle()
    manifests = ManifestStore(store)
    stored = manifests.load()
    assert stored is not None and (stored.manifest.l0 or stored.manifest.sorted_runs)
    old = as_version_1(stored.manifest)
    # ``format_version`` says how it is stored (what ``slatepy inspect`` shows).
    assert Manifest.decode(old) == msgspec.structs.replace(stored.manifest, format_version=1)
    assert manifests.objects.create(stored.id + 1, old) is None  # the newest is version 1
    with Db.open(store, settings=settings) as db:
        assert [db.get(b"key%04d" % i) for i in range(200)] == [b"v%d" % i for i in range(200)]
    newest = ManifestStore(store)
    latest = newest.latest_id()
    assert latest is not None and latest > stored.id + 1  # the writer's open updated it
    data = newest.objects.read(latest)
    assert int.from_bytes(data[4:6], "little") == 2
