"""Migrations (issue 31): an old-version catalog opened by new code migrates once;
``check_open``/``upgrade-check`` on it change nothing; read-only opens refuse it; a catalog
newer than the code is refused naming both versions."""

from __future__ import annotations

import json

import msgspec
import pytest

from slatepy.catalog import (
    CATALOG_VERSION,
    IncompatibleCatalogVersion,
    MigrationNeeded,
)
from slatepy.catalog.open import open_storage
from slatepy.catalog.snapshot import diff_objects
from slatepy.catalog.upgrade import MIGRATIONS, upgrade, v1
from slatepy.catalog.upgrade.v1 import SourceV1
from slatepy.cli.main import main
from tests.catalog.conftest import Place


def _write_v1(place: Place) -> None:
    """Write what version-1 code wrote: its initial objects and a source whose URL has a
    password."""
    objects = v1.initial_objects()
    objects["sources"] = {
        b'{"id":1}': msgspec.json.encode(
            SourceV1("pg", "postgres", url="postgresql://me:hunter2@db/app", data_shard="d")
        )
    }
    storage = open_storage(place.url, shard=place.shard, settings=place.settings)
    try:
        assert storage.read().upper == 0
        storage.write(diff_objects({}, objects), expected_upper=0, epoch=0, new_epoch=1)
    finally:
        storage.close()


def test_the_migration_is_a_pure_function() -> None:
    objects = v1.initial_objects()
    objects["sources"] = {b'{"id":1}': msgspec.json.encode(SourceV1("s", "k", url="x://u:p@h"))}
    frozen = json.dumps({k: sorted(v.items()) for k, v in objects.items()}, default=repr)
    migrated, found = upgrade(objects)
    assert found == 1 and set(MIGRATIONS) == {1}
    assert json.dumps({k: sorted(v.items()) for k, v in objects.items()}, default=repr) == frozen
    assert json.loads(migrated["sources"][b'{"id":1}'])["connection"] == "x://u@h"


def test_an_old_catalog_migrates_once(single: Place, capsys: pytest.CaptureFixture[str]) -> None:
    _write_v1(single)
    probe = single.state()
    before = probe.dump()
    assert probe.check_open() == (1, CATALOG_VERSION)
    if single.settings is None:  # the CLI takes its S3 settings from the environment
        argv = ["catalog", "upgrade-check", single.url, "--shard", single.shard]
        assert main(argv) == 0
        assert "from version 1 to 2 would succeed" in capsys.readouterr().out
    with pytest.raises(MigrationNeeded, match="version 1"):
        single.state().open_read_only()
    assert single.state().dump() == before  # none of it wrote anything
    state = single.state()
    state.open()
    assert state.epoch == 2
    assert state.config("catalog_version") == CATALOG_VERSION
    (_, source), = state.entries("sources")  # fmt: skip
    assert source["connection"] == "postgresql://me@db/app"
    assert "hunter2" not in state.dump()
    assert state.id_allocators()["storage_usage"] == 1
    again = single.state()
    again.open()
    events = [v["event_type"] for _, v in again.entries("audit_log")]
    assert events == ["migrate", "open"]  # once: version 1 wrote no audit event of its own


def test_a_catalog_newer_than_the_code_is_refused(single: Place) -> None:
    single.state().open()
    single.state().debug_commit(
        lambda tx: tx.set_config("catalog_version", CATALOG_VERSION + 1), user="test"
    )
    for attempt in (
        lambda s: s.open(),
        lambda s: s.open_read_only(),
        lambda s: s.check_open(),
    ):
        with pytest.raises(IncompatibleCatalogVersion) as caught:
            attempt(single.state())
        assert f"version {CATALOG_VERSION + 1}" in str(caught.value)
        assert f"version {CATALOG_VERSION}:" in str(caught.value)
        assert (caught.value.found, caught.value.code) == (CATALOG_VERSION + 1, CATALOG_VERSION)
