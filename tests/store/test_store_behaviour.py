"""The ObjectStore contract, run against every backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy.config import Settings
from slatepy.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    StoreUnavailable,
    UnsupportedStore,
)
from slatepy.store import IfMatch, MetricsStore, ObjectMeta, ObjectStore, PutMode, open_store
from slatepy.store.base import WrappingStore
from slatepy.store.cas import create_if_absent
from slatepy.store.obstore_store import STREAM_PART_BYTES
from tests.conftest import Backend


def test_put_get_and_ranges(backend: Backend) -> None:
    store = backend.store()
    store.put("a/obj", b"0123456789")
    assert store.get("a/obj") == b"0123456789"
    assert store.get_range("a/obj", 2, 5) == b"234"
    assert store.get_ranges("a/obj", [(0, 2), (8, 10)]) == [b"01", b"89"]
    assert store.get_suffix("a/obj", 3) == b"789"
    assert store.get_suffix("a/obj", 100) == b"0123456789"
    assert store.head("a/obj").size == 10


def test_create_mode_refuses_existing_objects(backend: Backend) -> None:
    store = backend.store()
    store.put("x", b"first", mode="create")
    with pytest.raises(AlreadyExists):
        store.put("x", b"second", mode="create")
    assert store.get("x") == b"first"
    store.put("x", b"third")  # overwrite is unconditional
    assert store.get("x") == b"third"


def test_if_match_updates(backend: Backend) -> None:
    store = backend.store()
    if not store.supports_if_match:
        pytest.skip("this backend has no atomic If-Match writes")
    etag = store.put("m", b"v1")
    assert etag
    store.put("m", b"v2", mode=IfMatch(etag))
    with pytest.raises(PreconditionFailed):
        store.put("m", b"v3", mode=IfMatch(etag))
    assert store.get("m") == b"v2"


def test_missing_objects_raise_not_found(backend: Backend) -> None:
    store = backend.store()
    with pytest.raises(NotFound):
        store.get("missing")
    with pytest.raises(NotFound):
        store.head("missing")
    store.delete("missing")  # idempotent


def test_list_is_sorted_and_respects_prefix_and_offset(backend: Backend) -> None:
    store = backend.store()
    for name in ["d/3", "d/1", "d/2", "e/1"]:
        store.put(name, name.encode())
    assert [m.path for m in store.list("d/")] == ["d/1", "d/2", "d/3"]
    assert [m.path for m in store.list("d/", offset="d/1")] == ["d/2", "d/3"]
    assert store.list("nothing/") == []
    store.delete("d/2")
    assert [m.path for m in store.list("d/")] == ["d/1", "d/3"]
    assert all(isinstance(m, ObjectMeta) and m.size == 3 for m in store.list("d/"))


def test_copy(backend: Backend) -> None:
    store = backend.store()
    store.put("src", b"payload")
    store.copy("src", "dst")
    assert store.get("dst") == b"payload"


def test_metrics_count_requests_and_bytes(backend: Backend) -> None:
    store = MetricsStore(backend.store())
    store.put("k", b"12345")
    store.get("k")
    store.get_range("k", 0, 2)
    with pytest.raises(NotFound):
        store.get("nope")
    ops = store.metrics.snapshot()
    assert ops["put"].requests == 1 and ops["put"].bytes_out == 5
    assert ops["get"].requests == 2 and ops["get"].errors == 1 and ops["get"].bytes_in == 5
    assert ops["get_range"].bytes_in == 2


def test_metrics_count_a_streamed_write_as_its_upload_requests() -> None:
    """A multipart upload is billed per request: create, each part, complete."""
    store = MetricsStore(open_store("memory://"))
    writer = store.open_writer("big")
    for _ in range(5):
        writer.write(b"x" * (STREAM_PART_BYTES // 2))
    writer.commit()
    small = store.open_writer("small")
    small.write(b"12345")
    small.commit()
    put = store.metrics.snapshot()["put"]
    assert put.requests == (3 + 2) + 1
    assert put.bytes_out == 5 * (STREAM_PART_BYTES // 2) + 5


class _LandThenFail(WrappingStore):
    """Performs the first create, then reports an indefinite failure (a lost response)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.calls = 0

    def put(self, path: str, data: bytes, *, mode: PutMode = "overwrite") -> str | None:
        self.calls += 1
        etag = self.inner.put(path, data, mode=mode)
        if self.calls == 1:
            raise StoreUnavailable("response lost", path=path, definite=False)
        return etag


def test_create_if_absent_resolves_a_lost_response_as_success(backend: Backend) -> None:
    store = _LandThenFail(backend.store())
    assert create_if_absent(store, "slot", b"mine", backoff=0) is None
    assert store.calls == 2
    assert backend.store().get("slot") == b"mine"


def test_create_if_absent_returns_the_winners_bytes(backend: Backend) -> None:
    store = backend.store()
    store.put("slot", b"theirs", mode="create")
    assert create_if_absent(store, "slot", b"mine") == b"theirs"


def test_bad_urls_are_typed_errors(tmp_path: object) -> None:
    with pytest.raises(UnsupportedStore):
        open_store("ftp://host/x")
    with pytest.raises(InvalidArgument):
        open_store("file://relative/path")
    with pytest.raises(InvalidArgument):
        open_store("s3:///no-bucket")
    with pytest.raises(InvalidArgument):
        open_store(42)  # type: ignore[arg-type]


@pytest.mark.s3
def test_missing_bucket_is_not_found(s3_endpoint: object) -> None:
    from tests.conftest import s3_settings

    store = open_store("s3://no-such-bucket/db", s3_settings(s3_endpoint))  # type: ignore[arg-type]
    with pytest.raises(NotFound, match="bucket"):
        store.list("manifest/")
    with pytest.raises(NotFound, match="bucket"):
        store.put("x", b"1")


def test_cloud_urls_build_stores_from_their_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    cloud = Settings(instance_credentials=True)  # a role would give them; nothing is sent
    assert open_store("gs://bucket/prefix", cloud).url == "gs://bucket/prefix"
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    with pytest.raises(InvalidArgument, match="Account"):
        open_store("az://container/prefix")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "account")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "a2V5")
    assert open_store("az://container/prefix").url == "az://container/prefix"


def test_urls_never_leak_credentials() -> None:
    store = open_store("s3://user:secret@bucket/prefix", Settings(instance_credentials=True))
    assert "secret" not in store.url


def test_file_reads_bypass_obstore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On file:// a ranged read is a pread, not a request through obstore's runtime (about
    87 µs each here, which bounded random gets on large databases; issue 18)."""
    import obstore

    store = open_store(f"file://{tmp_path}/db", create=True)
    store.put("compacted/a.sst", b"0123456789")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("read went through obstore")

    for name in ("get", "get_range", "get_ranges"):
        monkeypatch.setattr(obstore, name, refuse)
    assert store.get("compacted/a.sst") == b"0123456789"
    assert store.get_range("compacted/a.sst", 2, 5) == b"234"
    assert store.get_ranges("compacted/a.sst", [(0, 1), (8, 20)]) == [b"0", b"89"]
    assert store.get_suffix("compacted/a.sst", 3) == b"789"
    with pytest.raises(NotFound):
        store.get_range("compacted/missing.sst", 0, 1)
    with pytest.raises(InvalidArgument):
        store.get("../escape")
