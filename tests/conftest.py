"""Shared fixtures: backends (memory, file, S3 over HTTP via moto, Azure Blob via Azurite,
MinIO when configured)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from slatepy.config import Settings
from slatepy.store import ObjectStore, open_store
from slatepy.store.dynamodb import create_table
from slatepy.testing.azurite import (
    AzureEndpoint,
    azurite_server,
    create_container,
    find_azurite,
    install_dir,
)
from slatepy.testing.moto import S3Endpoint, create_bucket, moto_server

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

TEST_BUCKET = "slatepy-test"
TEST_TABLE = "slatepy-two-phase"


@dataclass
class Backend:
    """One store location for a test; ``store()`` returns a store on the same objects."""

    name: str
    url: str
    settings: Settings
    _shared: ObjectStore | None = None

    def store(self) -> ObjectStore:
        if self._shared is not None:
            return self._shared
        # A fresh location for the test to fill: it may be created (a file:// directory).
        return open_store(self.url, self.settings, create=True)

    def target(self) -> str | ObjectStore:
        """What to pass to ``Db.open``: the URL, or the shared instance for memory."""
        return self._shared if self._shared is not None else self.url


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    """One moto server on 127.0.0.1 for the session: S3 (a bucket) and DynamoDB (a table)."""
    with moto_server() as endpoint:
        create_bucket(endpoint, TEST_BUCKET)
        create_table(
            s3_settings(endpoint, dynamodb_table=TEST_TABLE, dynamodb_endpoint=endpoint.url)
        )
        yield endpoint


@pytest.fixture(scope="session", autouse=True)
def _disk_cache_in_a_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests that open remote stores with default settings get the disk cache (on for s3://
    and az://) under a temporary directory, not ``~/.cache/slatepy``; Azurite's install
    location is pinned first, as it also derives from ``XDG_CACHE_HOME``."""
    saved = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "SLATEPY_TEST_AZURITE_HOME")}
    os.environ["SLATEPY_TEST_AZURITE_HOME"] = str(install_dir())
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def azure_endpoint() -> Iterator[AzureEndpoint]:
    """One Azurite on 127.0.0.1 for the session, with the test container.

    Azurite is installed on first use when npm is present (``.ci/run`` installs it ahead);
    the azure tests skip only where Node.js, or both Azurite and npm, are missing.
    """
    if shutil.which("node") is None:
        pytest.skip("azure tests need Node.js to run Azurite (`node` is not on PATH)")
    if find_azurite() is None and shutil.which("npm") is None:
        pytest.skip("azure tests need Azurite: no azurite-blob installed and no npm to install it")
    with azurite_server() as endpoint:
        create_container(endpoint, TEST_BUCKET)
        yield endpoint


def azure_settings(endpoint: AzureEndpoint, **overrides: object) -> Settings:
    return Settings.from_dict({**endpoint.settings_fields(), **overrides})


def _minio_endpoint() -> S3Endpoint | None:
    url = os.environ.get("SLATEPY_TEST_S3_ENDPOINT")
    if not url:
        return None
    return S3Endpoint(
        url,
        access_key_id=os.environ.get("SLATEPY_TEST_S3_ACCESS_KEY", "minioadmin"),
        secret_access_key=os.environ.get("SLATEPY_TEST_S3_SECRET_KEY", "minioadmin"),
    )


def _ensure_minio_bucket(endpoint: S3Endpoint, bucket: str) -> None:
    from urllib.parse import urlsplit

    from minio import Minio

    parts = urlsplit(endpoint.url)
    client = Minio(
        parts.netloc,
        access_key=endpoint.access_key_id,
        secret_key=endpoint.secret_access_key,
        secure=parts.scheme == "https",
    )
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)


def s3_settings(endpoint: S3Endpoint, **overrides: object) -> Settings:
    return Settings.from_dict(
        {
            "s3_endpoint": endpoint.url,
            "s3_region": endpoint.region,
            "s3_access_key_id": endpoint.access_key_id,
            "s3_secret_access_key": endpoint.secret_access_key,
            "s3_allow_http": endpoint.url.startswith("http://"),
            **overrides,
        }
    )


BACKENDS = [
    "memory",
    "file",
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("s3-dynamodb", marks=pytest.mark.s3),
    pytest.param("azure", marks=pytest.mark.azure),
]
if os.environ.get("SLATEPY_TEST_S3_ENDPOINT"):
    BACKENDS.append(pytest.param("minio", marks=pytest.mark.s3))


def make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    # Tests drive compaction themselves, so the writer's own compactor is off; and the
    # writer keeps nothing compacted in memory, so its reads after a compaction read SSTs
    # (tests/engine/test_retention.py covers keeping them).
    common: dict[str, Any] = {
        "flush_interval": 0.02,
        "compactor": "off",
        "memtable_retain_bytes": 0,
    }
    fast = Settings(**common)
    if name == "memory":
        return Backend(name, "memory://", fast, open_store("memory://"))
    if name == "file":
        return Backend(name, f"file://{tmp_path}/db", fast)
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    cache = str(tmp_path / "disk-cache")  # the disk cache is on for remote stores: not ~/.cache
    if name == "azure":
        settings = azure_settings(
            request.getfixturevalue("azure_endpoint"),
            **common,
            disk_cache_dir=cache,
        )
        return Backend(name, f"az://{TEST_BUCKET}/{prefix}", settings)
    if name == "s3-dynamodb":
        endpoint = request.getfixturevalue("s3_endpoint")
        settings = s3_settings(
            endpoint,
            **common,
            cas="dynamodb",
            dynamodb_table=TEST_TABLE,
            dynamodb_endpoint=endpoint.url,
            disk_cache_dir=cache,
        )
        return Backend(name, f"s3://{TEST_BUCKET}/{prefix}", settings)
    if name == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
    else:
        endpoint = _minio_endpoint()
        assert endpoint is not None
        _ensure_minio_bucket(endpoint, TEST_BUCKET)
    return Backend(
        name,
        f"s3://{TEST_BUCKET}/{prefix}",
        s3_settings(endpoint, **common, disk_cache_dir=cache),
    )


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh, empty database location on each backend."""
    return make_backend(request.param, request, tmp_path)
