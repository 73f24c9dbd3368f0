"""Reading SSTs from the store: top-level indexes pinned, partitions and blocks cached.

Costs, whatever the size of the SST (RFC 0009):

* Open (once per SST): one ranged GET of the object's last ``META_PREFETCH`` bytes, which
  holds the footer, the top-level index and the properties (a second GET only when they are
  larger). With the object's size known (a manifest's ``SstHandle.object_size``) that is a
  plain range GET ``[size - prefetch, size)``; only without it a suffix GET, which Azure does
  not have. The decoded top level stays in memory ("pinned") and is counted.
* Point get: at most one GET of one index partition (cached in a byte-bounded LRU, and often
  already read with the tail) and one GET of one block; none once cached. The partition's
  bloom filter rules out most absent keys before any block is read.
* Batched get (:meth:`TableReader.get_many`): each partition and block the keys need is
  read once, the missing ones coalesced into ranged GETs (neighbours less than
  ``COALESCE_GAP`` apart, up to ``scan_read_ahead_bytes`` each), issued together.
* Scan: consecutive blocks in chunks of one ranged GET each, 64 KiB growing to
  ``scan_read_ahead_bytes``; while the caller consumes one chunk, a background thread loads
  the next (at most two chunks in memory per scan). The thread exists only while the scan
  reads from the store and is joined when the iterator is exhausted, closed or collected.

One job a module: :mod:`~slatepy.table.sst_tops` (the state, opening SSTs, partitions),
:mod:`~slatepy.table.point_reads` (gets), :mod:`~slatepy.table.scans` with
:mod:`~slatepy.table.chunks` and :mod:`~slatepy.table.grouping` (scans).
"""

from __future__ import annotations

from slatepy.table.grouping import Piece
from slatepy.table.point_reads import PointReads
from slatepy.table.scans import Scans
from slatepy.table.sst_tops import TableStats

__all__ = ["Piece", "TableReader", "TableStats"]  # Piece: where compactor.executor imports it


class TableReader(PointReads, Scans):
    """Cached access to the SSTs of one store (safe to share between threads).

    Memory: the pinned top levels (a few KB per SST, see :meth:`retain`), the meta cache of
    index partitions (``meta_cache_bytes``), the block cache (``block_cache_bytes``), and up
    to ``scan_requests_in_flight`` + 1 read-ahead chunks per running scan.

    Args:
        store: Where the SSTs are.
        cache_bytes: The old single knob: block cache size, and an eighth of it (at least
            1 MiB) for the meta cache, where the explicit sizes below are not given.
        block_cache_bytes: Bytes of decoded data blocks (``Settings.block_cache_bytes``).
        meta_cache_bytes: Bytes of decoded index partitions (``Settings.meta_cache_bytes``).
        scan_read_ahead_bytes: Largest GET a scan issues (``Settings.scan_read_ahead_bytes``).
        scan_requests_in_flight: Chunks a scan fetches ahead, each one GET in flight at a
            time (``Settings.scan_requests_in_flight``).
        meta_prefetch: Bytes read at the end of an SST to open it.
    """
