"""One configuration story (issue 32 item 1): every entry point resolves settings by the same
precedence (explicit, ``SLATEPY_*``, a TOML file, the provider's variables, defaults), takes
``settings=`` as a ``Settings``, a dict or a path, and a remote store without credentials is
an error naming what to set, raised before any request."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from slatepy.cli.main import main
from slatepy.config import Settings, resolve_settings
from slatepy.engine.db import Db
from slatepy.engine.reader import DbReader
from slatepy.engine.wal_reader import WalReader
from slatepy.errors import InvalidArgument
from slatepy.persist import PersistClient, PersistSettings
from slatepy.store.url import open_store
from slatepy.testing.moto import S3Endpoint
from tests.conftest import TEST_BUCKET

_PROVIDER_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_SKIP_SIGNATURE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_BEARER_TOKEN",
    "GOOGLE_BASE_URL",
)


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """An environment with no SLATEPY_* settings and no cloud credentials."""
    for name in list(os.environ):
        if name.startswith("SLATEPY_") and not name.startswith("SLATEPY_TEST_"):
            monkeypatch.delenv(name)
    for name in _PROVIDER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    return monkeypatch


def _export_s3(monkeypatch: pytest.MonkeyPatch, endpoint: S3Endpoint) -> None:
    """The README's exports for an S3-compatible server."""
    monkeypatch.setenv("SLATEPY_S3_ENDPOINT", endpoint.url)
    monkeypatch.setenv("SLATEPY_S3_ACCESS_KEY_ID", endpoint.access_key_id)
    monkeypatch.setenv("SLATEPY_S3_SECRET_ACCESS_KEY", endpoint.secret_access_key)


# -- the precedence -----------------------------------------------------------------------


def test_explicit_then_environment_then_file_then_defaults(
    bare_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    toml = tmp_path / "slatepy.toml"
    toml.write_text("flush_interval = 0.5\ngc_min_age = 60\nblock_size = 8192\n")
    bare_env.setenv("SLATEPY_CONFIG", str(toml))
    bare_env.setenv("SLATEPY_GC_MIN_AGE", "120")
    bare_env.setenv("SLATEPY_BLOCK_SIZE", "16384")

    resolved = resolve_settings({"block_size": 1024})
    assert resolved.block_size == 1024  # explicit beats the environment
    assert resolved.gc_min_age == 120  # the environment beats the file
    assert resolved.flush_interval == 0.5  # the file beats the defaults
    assert resolved.compaction_interval == Settings().compaction_interval  # default
    # A Settings is explicit in the fields it sets; a field left at its default is unset.
    assert resolve_settings(Settings(block_size=1024)) == resolved
    # A path given as settings= is the file (instead of $SLATEPY_CONFIG), still below env.
    other = tmp_path / "other.toml"
    other.write_text("flush_interval = 0.25\ngc_min_age = 5\n")
    from_path = resolve_settings(str(other))
    assert (from_path.flush_interval, from_path.gc_min_age) == (0.25, 120)
    assert resolve_settings(resolved) == resolved  # resolving twice changes nothing


def test_bounds_hold_of_the_result_not_of_each_layer(bare_env: pytest.MonkeyPatch) -> None:
    bare_env.setenv("SLATEPY_COMPACTION_INTERVAL", "20")  # alone: lease 30 < 3 * 20
    assert resolve_settings({"compactor_lease": 90}).compaction_interval == 20
    with pytest.raises(InvalidArgument, match="compactor_lease"):
        resolve_settings()
    bare_env.setenv("SLATEPY_FLUSH_INTERVALL", "1")
    with pytest.raises(InvalidArgument, match="did you mean 'SLATEPY_FLUSH_INTERVAL'"):
        resolve_settings()


def test_bad_settings_name_their_source(bare_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    toml = tmp_path / "slatepy.toml"
    toml.write_text("flush_intervall = 0.5\n")
    with pytest.raises(InvalidArgument, match=r"slatepy\.toml'; did you mean 'flush_interval'"):
        resolve_settings(toml)
    with pytest.raises(InvalidArgument, match="cannot read the settings file"):
        resolve_settings(tmp_path / "missing.toml")
    with pytest.raises(InvalidArgument, match="settings must be"):
        resolve_settings(42)  # type: ignore[arg-type]


def test_every_entry_point_takes_a_dict_and_the_environment(
    bare_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}/db"
    bare_env.setenv("SLATEPY_COMPACTOR", "off")
    with Db.open(url, settings={"flush_interval": 0.05}) as db:
        assert db._settings.compactor == "off" and db._settings.flush_interval == 0.05
        db.put(b"k", b"v")
    with DbReader.open(url, settings={"reader_poll_interval": 0.5}, read_only=True) as reader:
        assert reader.get(b"k") == b"v"
    wal = WalReader(url, settings={"reader_poll_interval": 0.5})
    try:
        assert wal._settings.reader_poll_interval == 0.5 and wal._settings.compactor == "off"
    finally:
        wal.close()


# -- S3 and GCS: the environment is read, and missing credentials are named ----------------


@pytest.mark.s3
def test_python_opens_s3_from_the_slatepy_variables(
    bare_env: pytest.MonkeyPatch, s3_endpoint: S3Endpoint
) -> None:
    """Regression (issue 32): with the README's exports set, ``DbReader.open("s3://...")``
    went to the EC2 metadata server; only the CLI read ``SLATEPY_*``. Fails on d969bf0."""
    _export_s3(bare_env, s3_endpoint)
    bare_env.setenv("SLATEPY_STORE_TIMEOUT", "5")
    url = f"s3://{TEST_BUCKET}/config-{uuid.uuid4().hex[:8]}"
    with Db.open(url, settings={"compactor": "off", "disk_cache": "off"}) as db:
        db.put(b"k", b"v")
    with DbReader.open(url, read_only=True) as reader:
        assert reader.get(b"k") == b"v"
    assert main(["inspect", url]) == 0


def test_missing_s3_credentials_name_what_to_set_before_any_request(
    bare_env: pytest.MonkeyPatch,
) -> None:
    """Regression (issue 32): no credentials meant a request to the metadata server and a
    "reachable?" error; now an error naming the settings, with no request. Fails on d969bf0."""
    bare_env.setenv("SLATEPY_STORE_TIMEOUT", "2")
    started = time.monotonic()
    with pytest.raises(InvalidArgument) as raised:
        DbReader.open("s3://bucket/db", read_only=True)
    assert time.monotonic() - started < 1.0
    message = str(raised.value)
    for name in ("SLATEPY_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID", "instance_credentials"):
        assert name in message
    with pytest.raises(InvalidArgument, match="GOOGLE_APPLICATION_CREDENTIALS"):
        open_store("gs://bucket/db")


def test_roles_and_opt_ins_count_as_configured(
    bare_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Opening builds a client and sends nothing, so these need no server."""
    assert open_store("s3://bucket/db", Settings(instance_credentials=True))
    bare_env.setenv("SLATEPY_INSTANCE_CREDENTIALS", "true")
    assert open_store("gs://bucket/db", resolve_settings())
    bare_env.delenv("SLATEPY_INSTANCE_CREDENTIALS")
    token = tmp_path / "token"
    token.write_text("jwt")
    bare_env.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    bare_env.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/slatepy")
    assert open_store("s3://bucket/db")
    bare_env.delenv("AWS_WEB_IDENTITY_TOKEN_FILE")
    bare_env.setenv("AWS_SKIP_SIGNATURE", "true")
    assert open_store("s3://bucket/db")


# -- persist: one keyword -----------------------------------------------------------------


def test_persist_client_takes_settings_like_every_entry_point(
    bare_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Regression (issue 32): ``PersistClient.open(url, settings=Settings(...))`` raised an
    AttributeError (it wanted ``store_settings=``). Fails on d969bf0."""
    url = f"file://{tmp_path}/persist"
    with PersistClient.open(url, settings=Settings(store_timeout=7.0)) as client:
        assert client.settings == PersistSettings()
    mixed = {"store_timeout": 7.0, "reader_lease": 60.0, "write_stall_timeout": 5.0}
    with PersistClient.open(url, settings=mixed) as client:
        assert (client.settings.reader_lease, client.settings.write_stall_timeout) == (60.0, 5.0)
    with PersistClient.open(url, settings=PersistSettings(reader_lease=30.0)) as client:
        assert client.settings.reader_lease == 30.0
    with pytest.warns(DeprecationWarning, match="store_settings"):
        PersistClient.open(url, store_settings=Settings()).close()
    with pytest.raises(InvalidArgument, match="not both"):
        PersistClient.open(url, settings=Settings(), store_settings=Settings())
