"""A clone whose first manifest's create has an uncertain outcome (RFC 0017; found by the
torture state machine): the clone either succeeds or fails with the source's checkpoint
intact for whatever landed, never leaving a database whose shared SSTs GC may take."""

from __future__ import annotations

from pathlib import Path

from slatepy import Db, DbReader, Settings, clone
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.engine.checkpoint import list_checkpoints
from slatepy.errors import StoreUnavailable
from slatepy.gc import GarbageCollector
from slatepy.store import open_store
from slatepy.store.base import ObjectStore, PutData, PutMode, WrappingStore

FIRST_MANIFEST = "manifest/00000000000000000001.manifest"
SETTINGS = Settings(compactor="off", flush_interval=60)


class LostReplyThenFailedRead(WrappingStore):
    """The first manifest's create lands but its reply is lost; the read-back that would
    resolve it fails once."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.lost, self.failed_read = False, False

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        etag = self.inner.put(path, data, mode=mode)
        if path == FIRST_MANIFEST and not self.lost:
            self.lost = True
            raise StoreUnavailable("reply lost", path=path, definite=False)
        return etag

    def get(self, path: str) -> bytes:
        if path == FIRST_MANIFEST and self.lost and not self.failed_read:
            self.failed_read = True
            raise StoreUnavailable("refused", path=path, definite=True)
        return self.inner.get(path)


def test_a_clone_whose_manifest_landed_with_its_reply_lost_keeps_its_checkpoint(
    tmp_path: Path,
) -> None:
    src_url, dst_url = f"file://{tmp_path}/src", f"file://{tmp_path}/dst"
    with Db.open(src_url, settings=SETTINGS) as db:
        for i in range(20):
            db.put(b"k%02d" % i, b"v%d" % i)
        db.flush()
    src = open_store(src_url, SETTINGS)
    policy = CompactionPolicy(l0_trigger=1, size_ratio=2.0, max_wal_ssts=1)
    Compactor(src, settings=SETTINGS, policy=policy).run_until_idle()
    dst = LostReplyThenFailedRead(open_store(dst_url, SETTINGS, create=True))
    try:
        made = clone(src_url, dst, settings=SETTINGS)
    except StoreUnavailable:
        made = None
    # Whatever clone() said: a database at dst must keep its checkpoint in the source.
    assert made is not None, "the clone's manifest landed: the clone succeeded"
    assert made.id in {c.id for c in list_checkpoints(src, SETTINGS)}
    with Db.open(src_url, settings=SETTINGS) as db:
        db.put(b"k00", b"new")
    Compactor(src, settings=SETTINGS, policy=policy).run_until_idle()
    gc = GarbageCollector(src, settings=SETTINGS, min_age=0)
    gc.collect()
    gc.collect()
    with DbReader.open(dst_url, settings=SETTINGS) as reader:
        assert dict(reader.scan()) == {b"k%02d" % i: b"v%d" % i for i in range(20)}
