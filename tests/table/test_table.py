"""TableReader: scans read ahead (few large GETs) and still honour their bounds exactly."""

from __future__ import annotations

from slatepy.format.sst import SstBuilder
from slatepy.store import MetricsStore, open_store
from slatepy.table.reader import TableReader


def test_scan_reads_ahead_and_respects_bounds() -> None:
    store = MetricsStore(open_store("memory://"))
    builder = SstBuilder(writer_epoch=1, block_size=512)
    entries = [(b"key%05d" % i, i + 1, b"v" * 40) for i in range(5000)]
    builder.add_all(entries)
    encoded = builder.finish()
    store.put("t.sst", encoded.data)
    blocks = encoded.meta.props.block_count
    assert blocks > 300

    reader = TableReader(store)
    reader.meta("t.sst")
    store.metrics.reset()
    assert list(reader.scan("t.sst", b"", None)) == entries
    gets = store.metrics.requests("get_range")
    assert gets <= 6, f"{gets} GETs for {blocks} blocks"  # 64 KiB, 128 KiB, ... read-ahead

    cold = TableReader(store)
    got = list(cold.scan("t.sst", b"key01000", b"key01010"))
    assert got == entries[1000:1010]
    store.metrics.reset()
    assert list(cold.scan("t.sst", b"key01000", b"key01010")) == entries[1000:1010]
    assert store.metrics.requests("get_range") == 0  # cached by the first short scan
