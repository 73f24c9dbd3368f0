"""A writer of version 1 SSTs (RFC 0002), as slatepy wrote them before RFC 0009.

Only tests use it: they need old databases' SSTs to check that readers still accept them.
``test_sst_versions.py`` pins it to bytes written by the old code (``data/v1-sample.sst``).
"""

from __future__ import annotations

import struct

from slatepy.format.block import BlockBuilder, Entry
from slatepy.format.bloom import build_filter
from slatepy.format.checksum import checksum
from slatepy.format.sst import FOOTER, FOOTER_CHECKSUM, SST_MAGIC, SstProperties, encode_props

_INDEX_ENTRY = struct.Struct("<QIH")
_COUNT = struct.Struct("<I")


def build_v1(
    entries: list[Entry], *, writer_epoch: int, block_size: int = 4096, bits_per_key: int = 10
) -> bytes:
    """Encode ``entries`` (sorted, unique keys) as a version 1 SST."""
    block = BlockBuilder(indexed=False)
    parts: list[bytes] = []
    index = [b""]
    offset = 0
    first: bytes | None = None
    count = 0

    def close() -> None:
        nonlocal offset, first, count
        if not len(block) or first is None:
            return
        data = block.finish()
        index.append(_INDEX_ENTRY.pack(offset, len(data), len(first)) + first)
        parts.append(data)
        offset += len(data)
        first = None
        count += 1

    for key, seq, value in entries:
        if first is None:
            first = key
        block.add(key, seq, value)
        if block.encoded_size >= block_size:
            close()
    close()
    index[0] = _COUNT.pack(count)
    keys = [k for k, _, _ in entries]
    seqs = [s for _, s, _ in entries]
    props = SstProperties(
        entry_count=len(entries),
        tombstone_count=sum(v is None for _, _, v in entries),
        first_key=keys[0] if keys else None,
        last_key=keys[-1] if keys else None,
        min_seq=min(seqs) if seqs else 0,
        max_seq=max(seqs) if seqs else 0,
        writer_epoch=writer_epoch,
        block_count=count,
        data_size=offset,
    )
    index_bytes = b"".join(index)
    bloom = build_filter(keys, len(keys), bits_per_key) if keys and bits_per_key else b""
    props_bytes = encode_props(props)
    meta = index_bytes + bloom + props_bytes
    footer = FOOTER.pack(
        SST_MAGIC, 1, 0, offset, len(index_bytes), len(bloom), len(props_bytes), checksum(meta)
    )
    footer += FOOTER_CHECKSUM.pack(checksum(footer))
    return b"".join([*parts, meta, footer])


def sample_entries() -> list[Entry]:
    """The entries of ``data/v1-sample.sst`` (written by the old ``SstBuilder`` with
    ``writer_epoch=9, block_size=256``)."""
    return [
        (b"key%04d" % i, 1000 + i, None if i % 11 == 0 else b"value-%d-" % i * (1 + i % 5))
        for i in range(150)
    ]
