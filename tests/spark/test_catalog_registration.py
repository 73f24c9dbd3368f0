"""Option ``catalog`` of the Spark sinks (RFC 0028 Addendum C): the KV bulk load records its
database, the ``slatepy.persist`` sink its sink and shard, on the driver before anything is
written; a rerun records nothing twice; a bad catalog fails the write with nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slatepy.catalog import open_catalog
from slatepy.persist import PersistClient

pytestmark = pytest.mark.spark


def _kv(df: Any, url: str, catalog: str) -> None:
    writer = df.write.format("slatepy").option("url", url).option("key", "id")
    writer.option("catalog", catalog).mode("append").save()


def _persist(df: Any, url: str, catalog: str) -> None:
    writer = df.write.format("slatepy.persist").option("url", url).option("shard", "events")
    writer.option("catalog", catalog).mode("append").save()


def test_sinks_register_once_and_a_bad_catalog_writes_nothing(spark: Any, tmp_path: Path) -> None:
    catalog = f"sqlite:///{tmp_path}/catalog.db"
    with open_catalog(catalog) as state:
        state.open()
    kv_url, persist_url = f"file://{tmp_path}/kv", f"file://{tmp_path}/persist"
    rows = spark.createDataFrame([(i, f"n{i}") for i in range(10)], "id long, name string")
    pairs = spark.createDataFrame([(b"k1", b"vk1")], "key binary, value binary")

    bad = f"sqlite:///{tmp_path}/not-a-catalog.db"
    with pytest.raises(Exception, match=r"UninitializedCatalog|no catalog"):
        _kv(rows, kv_url, bad)
    with pytest.raises(Exception, match=r"UninitializedCatalog|no catalog"):
        _persist(pairs, persist_url, bad)
    assert not (tmp_path / "kv").exists() and not (tmp_path / "persist").exists()

    for _ in range(2):  # a rerun finds its objects by name: no duplicate, no uniqueness error
        _kv(rows, kv_url, catalog)
        _persist(pairs, persist_url, catalog)
    with open_catalog(catalog) as state:
        state.open_read_only()
        dump = json.loads(state.dump(ignore_large_collections=True))["collections"]
    assert [d["value"] for d in dump["databases"]] == [{"name": kv_url, "url": kv_url, "owner": ""}]
    sink_name = f"events@{persist_url}"
    assert [s["value"] for s in dump["sinks"]] == [
        {
            "name": sink_name,
            "kind": "slatepy.persist",
            "target": persist_url,
            "options": {"shard": "events"},
        }
    ]
    assert [(s["key"], s["value"]) for s in dump["shards"]] == [
        ({"location": persist_url, "shard": "events"}, {"purpose": "sink", "owner": sink_name})
    ]
    with PersistClient.open(persist_url) as client:  # the data was written (twice: no key)
        assert client.open_writer("events").fetch_recent_upper() == 2
