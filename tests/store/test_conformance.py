"""The shipped store conformance suite on every backend, and Azure-specific regressions.

Backends: memory, file, S3 over HTTP (moto), S3 with the DynamoDB two-phase CAS (moto),
Azure Blob (Azurite), MinIO when ``SLATEPY_TEST_S3_ENDPOINT`` names one. GCS is not here: no
emulator speaks obstore's GCS protocol (see the README's store table).
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import obstore
import pytest
from msgspec.structs import replace

from slatepy import Db, Settings
from slatepy.compactor import Compactor
from slatepy.errors import InvalidArgument, NotFound
from slatepy.store import MetricsStore, ObjectStore, obstore_store, open_store
from slatepy.store.url import AZURITE_ACCOUNT, AZURITE_KEY
from slatepy.testing.azurite import AZURITE_VERSION, AzureEndpoint
from slatepy.testing.conformance import StoreConformance
from tests.conftest import BACKENDS, Backend, azure_settings, make_backend

REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class TestConformance(StoreConformance):
    @pytest.fixture(params=BACKENDS)
    def backend(self, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
        return make_backend(request.param, request, tmp_path)

    @pytest.fixture
    def store(self, backend: Backend) -> ObjectStore:
        return backend.store()

    @pytest.fixture
    def unreachable_store(self, backend: Backend) -> ObjectStore | None:
        if backend.name in ("memory", "file"):
            return None
        endpoint = f"http://127.0.0.1:{_closed_port()}"
        quick = {"store_retries": 0, "store_timeout": 5.0, "cas": "conditional"}
        if backend.name == "azure":
            settings = replace(backend.settings, azure_endpoint=f"{endpoint}/x", **quick)
        else:
            settings = replace(backend.settings, s3_endpoint=endpoint, **quick)
        return open_store(backend.url, settings)

    @pytest.fixture
    def missing_bucket_store(self, backend: Backend) -> ObjectStore | None:
        if backend.name in ("memory", "file"):
            return None
        scheme = backend.url.split("://", 1)[0]
        return open_store(f"{scheme}://no-such-bucket/db", backend.settings)


# Azure: suffix reads without suffix ranges, and the engine on top of them.


@pytest.fixture
def azure(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend("azure", request, tmp_path)


@pytest.mark.azure
def test_compactor_reads_sst_footers_on_azure(azure: Backend) -> None:
    """Regression (issue 17): obstore refuses suffix ranges on Azure, and SST footers were
    read with one, so every compaction failed and compacted data could not be read."""
    with Db.open(azure.url, settings=azure.settings) as db:
        for i in range(300):
            db.put(b"key%04d" % i, b"value-%04d" % i, await_durable=False)
        db.flush()
    counted = MetricsStore(azure.store())
    compactor = Compactor(counted, settings=azure.settings)
    ran = compactor.run_until_idle()
    assert ran >= 1
    assert compactor.last_published.manifest.wal_id_last_compacted > 0
    # Footers are found from sizes the manifest or one WAL listing gives: no HEAD per SST,
    # only one per plan, of the next WAL SST (RFC 0021).
    assert counted.metrics.requests("head") == ran + 1
    with Db.open(azure.url, settings=azure.settings) as db:
        assert db.get(b"key0000") == b"value-0000"
        assert db.get(b"key0299") == b"value-0299"
        assert len(list(db.scan())) == 300


@pytest.mark.azure
def test_azure_suffix_reads_cost_a_head_and_a_range_get(
    azure: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = azure.store()
    assert store.supports_suffix is False
    assert MetricsStore(store).supports_suffix is False  # wrappers forward the capability
    store.put("obj", b"0123456789")
    calls = _count_obstore_calls(monkeypatch)
    assert store.get_suffix("obj", 4) == b"6789"
    assert calls == ["head", "get"]


@pytest.mark.azure
def test_azure_suffix_read_measures_again_when_the_object_is_replaced(
    azure: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The range GET is pinned to the HEAD's ETag: a replacement in between is never mixed
    with the old size; the read starts over on the new object."""
    store, other = azure.store(), azure.store()
    store.put("obj", b"old contents, long")
    replaced: list[bool] = []

    class ReplaceBeforeFirstGet:
        def __getattr__(self, name: str) -> Any:
            target = getattr(obstore, name)

            def call(*args: Any, **kwargs: Any) -> Any:
                if name == "get" and not replaced:
                    replaced.append(True)
                    monkeypatch.setattr(obstore_store, "obstore", obstore)
                    other.put("obj", b"new")
                    monkeypatch.setattr(obstore_store, "obstore", ReplaceBeforeFirstGet())
                return target(*args, **kwargs)

            return call

    monkeypatch.setattr(obstore_store, "obstore", ReplaceBeforeFirstGet())
    assert store.get_suffix("obj", 8) == b"new"
    assert replaced == [True]


def _count_obstore_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the names of the obstore functions ``ObstoreStore`` calls from now on."""
    calls: list[str] = []

    class Recorder:
        def __getattr__(self, name: str) -> Any:
            target = getattr(obstore, name)

            def call(*args: Any, **kwargs: Any) -> Any:
                calls.append(name)
                return target(*args, **kwargs)

            return call

    monkeypatch.setattr(obstore_store, "obstore", Recorder())
    return calls


def test_suffix_capability_is_on_where_suffix_ranges_exist() -> None:
    assert open_store("memory://").supports_suffix is True


# Configuration of az:// from settings and the environment.


def test_azure_settings_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "fromenv")
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    store = open_store(
        "az://container/db",
        Settings(azure_account="fromsettings", azure_access_key="a2V5", azure_use_emulator=False),
    )
    assert store.url == "az://container/db"


def test_azure_emulator_defaults_to_azurites_account(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURITE_BLOB_STORAGE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    assert open_store("az://container/db").url == "az://container/db"
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "false")
    with pytest.raises(InvalidArgument, match="azure_account"):
        open_store("az://container/db")


@pytest.mark.azure
def test_azure_emulator_from_the_environment_alone(
    azure_endpoint: AzureEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AZURE_STORAGE_USE_EMULATOR`` + ``AZURITE_BLOB_STORAGE_URL``, as obstore reads them."""
    base = azure_endpoint.url.rsplit("/", 1)[0]
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", base)
    for name in (
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    store = open_store("az://slatepy-test/env-only")
    store.put("x", b"1")
    assert store.get("x") == b"1"
    # The same objects through explicit settings.
    explicit = open_store(
        "az://slatepy-test/env-only",
        azure_settings(AzureEndpoint(azure_endpoint.url, AZURITE_ACCOUNT, AZURITE_KEY)),
    )
    assert explicit.get("x") == b"1"
    explicit.delete("x")
    with pytest.raises(NotFound):
        store.get("x")


def test_ci_installs_the_pinned_azurite() -> None:
    """``.ci/run`` reads the version from ``AZURITE_VERSION``; keep the two in one place."""
    script = (REPO / ".ci" / "run").read_text()
    assert "slatepy/testing/azurite.py" in script
    assert re.search(
        r'^AZURITE_VERSION = "[0-9.]+"$', (REPO / "slatepy/testing/azurite.py").read_text(), re.M
    )
    assert AZURITE_VERSION
