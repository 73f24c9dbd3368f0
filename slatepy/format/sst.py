"""Sorted string tables: the format of WAL objects and compacted tables alike.

Layout of versions 2 to 5 (integers little-endian; docs/rfcs/0009-sst-format-v2.md)::

    data block*    version 5 (RFC 0022): columnar blocks (slatepy.format.columnar), inside
                   a frame saying whether each is compressed (slatepy.format.compression)
                   when the properties name a codec, bare otherwise. Version 3: indexed
                   blocks (slatepy.format.block), with an offsets array; versions 1 and 2:
                   legacy blocks; otherwise versions 2 and 3 are the same. Version 4
                   (RFC 0018): each version 3 block inside a frame. Offsets and lengths in
                   the index are those of the stored (framed) blocks.
    partition*     one per run of consecutive data blocks (cut once its block entries reach
                   about ``block_size`` bytes):
                     count u32 | count x (offset u64 | length u32 | key_len u16 | first_key) |
                     filter_len u32 | filter (bloom over the keys of those blocks; may be empty) |
                     checksum u64 (XXH3-64 of the partition's bytes before it)
    top index      count u32 | count x (offset u64 | length u32 | data_offset u64 |
                                        first_block u32 | key_len u16 | first_key)
    props          msgpack SstProperties
    footer         magic "SLATESST" | version u16 (=5) | reserved u16 (=0) | meta_offset u64 |
                   partitions_len u32 | top_len u32 | props_len u32 |
                   meta_checksum u64 (XXH3-64 of top index|props) |
                   footer_checksum u64 (XXH3-64 of the footer bytes before it)

A point lookup needs the top index (small: one entry per partition, so a reader keeps it in
memory for every SST it reads) and ONE partition, whatever the size of the SST; the old
version 1 (RFC 0002: one flat index and one filter for the whole SST) made every lookup after
a cache miss decode the index and filter of the whole SST. Readers accept versions 1 to 5;
writers write 5. Everything here is a pure function of bytes; I/O
lives in the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from slatepy.errors import CorruptionError
from slatepy.format.block import (
    Block,
    Entry,
    decode_block,
)
from slatepy.format.columnar import decode_columnar
from slatepy.format.compression import unframe_block
from slatepy.format.sst_builder import EncodedSst, SstBuilder, SstMeta
from slatepy.format.sst_index import (
    COLUMNAR_BLOCKS_VERSION,
    COMPRESSED_BLOCKS_VERSION,
    FOOTER,
    FOOTER_CHECKSUM,
    FOOTER_SIZE,
    INDEXED_BLOCKS_VERSION,
    LOOKUP_BLOCKS_VERSION,
    SST_FORMAT_VERSION,
    SST_MAGIC,
    SUPPORTED_VERSIONS,
    BlockHandle,
    Footer,
    Partition,
    SstProperties,
    SstTop,
    decode_footer,
    decode_partition,
    decode_top,
)

__all__ = [
    "COLUMNAR_BLOCKS_VERSION",
    "COMPRESSED_BLOCKS_VERSION",
    "FOOTER",
    "FOOTER_CHECKSUM",
    "FOOTER_SIZE",
    "INDEXED_BLOCKS_VERSION",
    "LOOKUP_BLOCKS_VERSION",
    "SST_FORMAT_VERSION",
    "SST_MAGIC",
    "SUPPORTED_VERSIONS",
    "BlockHandle",
    "EncodedSst",
    "Footer",
    "Partition",
    "SstBuilder",
    "SstMeta",
    "SstProperties",
    "SstTop",
    "block_decoder",
    "decode_footer",
    "decode_partition",
    "decode_sst",
    "decode_stored_block",
    "decode_top",
]


def block_decoder(top: SstTop) -> Callable[[bytes | memoryview], Block]:
    """The function that verifies and decodes a data block of the SST ``top`` describes as
    stored (out of its compression frame first, if it has one), chosen once per SST.

    The function raises ``CorruptionError`` for a checksum mismatch or an impossible block.
    """
    if top.compressed_blocks:
        return lambda stored: decode_stored_block(unframe_block(stored), top)
    if top.version >= COLUMNAR_BLOCKS_VERSION:
        return decode_columnar
    return partial(decode_block, indexed=top.version >= INDEXED_BLOCKS_VERSION)


def decode_stored_block(data: bytes | memoryview, top: SstTop) -> Block:
    """Verify and decode a data block of the SST ``top`` describes, in whichever layout its
    version has (out of its compression frame already, if it had one).

    Raises:
        CorruptionError: checksum mismatch or a structurally impossible block.
    """
    if top.version >= COLUMNAR_BLOCKS_VERSION:
        return decode_columnar(data)
    return decode_block(data, indexed=top.version >= INDEXED_BLOCKS_VERSION)


def decode_sst(data: bytes) -> tuple[SstMeta, Iterator[Entry]]:
    """Decode a whole SST held in memory (any version): its meta and an iterator over all
    entries.

    Every checksum is verified: footer, top level and every partition here, each block's as
    the iterator reaches it.
    """
    footer = decode_footer(data)
    if footer.object_size != len(data):
        raise CorruptionError("SST: footer offsets do not match the object size")
    view = memoryview(data)
    top = decode_top(footer, view[footer.top_offset : len(data) - FOOTER_SIZE])
    partitions = tuple(
        decode_partition(top, p, view[top.offsets[p] : top.offsets[p + 1]])
        for p in range(top.partition_count)
    )
    meta = SstMeta(top, partitions)
    decode = block_decoder(top)

    def entries() -> Iterator[Entry]:
        for part in partitions:
            offsets = part.offsets
            for j, first_key in enumerate(part.first_keys):
                block = decode(view[offsets[j] : offsets[j + 1]])
                if block.keys[0] != first_key:
                    raise CorruptionError("SST: block's first key disagrees with the index")
                yield from block.entries()

    return meta, entries()
