"""Ingesting SSTs built outside the writer (bulk loads; RFC 0016, "Ingestion").

As RocksDB's external-file ingestion, with the same promise: the ingested keys are newer
than every write acknowledged before the publish, and writes made after it win over them;
the publish is one manifest compare-and-set, so it is all or nothing, and it works while a
writer (any process) is open on the database.

1. :func:`write_ingest_ssts` (any process, any number of them): sorted, distinct keys into
   SSTs under fresh ids in ``compacted/``, every entry with seq 0 (:func:`write_ingest_columns`:
   the same SSTs from chunks of key and value lists, built in bulk and streamed out).
   Nothing references them: if the load is abandoned, GC deletes them once they are
   ``gc_min_age`` old (rule 3).
2. :func:`publish_ingest` (one process, once): one manifest update that puts them at the
   front of L0 with one *global seq* ``G`` in their handles, which readers and the compactor
   give to each of their entries (``table.merge.stamped``).

**Choosing G.** Writers assign even seqs only (``Db``: step 2, starting at an even number),
so G is odd and strictly between two writes. Inside the update (after reading the manifest
it will replace, before the CAS), ``S`` is the highest seq that manifest and the WAL after
its ``wal_id_last_compacted`` hold (*every* listed WAL SST, not only the contiguous prefix: a
write is acknowledged once its own SST lands). ``G`` is the odd number just above ``S``, or
``S`` itself when ``S`` is the previous ingestion's G (no write came in between; the later
ingestion is in front in L0 and wins the tie, in reads and in compaction).

* Newer than every write acknowledged before the publish: such a write's WAL SST existed
  when the update listed the WAL (or it was compacted into the manifest read), so its seq
  is <= S < G. A write acknowledged between the listing and the CAS is concurrent with the
  publish, and either order is right for it.
* Older than every write made after the publish returned: every seq in the store was
  assigned by the live writer or by writers before it (whose seqs it started above), so
  its counter is >= S, and even; its next seq is >= S + 2 > G when G = S + 1, and >= S + 3
  > G when S is odd (G = S + 2). When G = S is the previous ingestion's G, the same holds
  by the argument for that ingestion: no write was acknowledged since, and the counter was
  already placed to give the next write a seq above it. A writer opened later starts above
  ``max_compacted_seq``, which counts G (the ingested handles' ``max_seq``), at an even
  number.

**Reading.** An ingested L0 SST breaks L0's "first hit is the newest" rule (a WAL compaction
published after the ingestion puts older writes in front of it), so while L0 holds one a
get asks every L0 SST and keeps the highest seq; and a memtable version older than the
manifest's ``last_ingest_seq`` is compared with the compacted one instead of winning
outright. Scans and compaction merge by seq anyway.

**GC.** Like a compactor's outputs (GC rules, RFC 0003), SSTs older than ``gc_min_age / 2``
are not published: GC deletes unreferenced SSTs once ``gc_min_age`` old, and the check, made
inside the update and followed by its CAS, is what GC's fence manifest relies on.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import accumulate, islice, repeat

import msgspec

from slatepy.config import Settings
from slatepy.engine.startup import read_wal_sst
from slatepy.errors import InvalidArgument, NotFound, SlatepyError
from slatepy.format.sst import SstBuilder
from slatepy.manifest.record import Manifest, SstHandle, handle_of
from slatepy.manifest.store import ManifestStore
from slatepy.store.base import ObjectStore
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX, compacted_path
from slatepy.table.sst_output import SEND_BYTES, StreamedSst, put_new_sst


class IngestAbandoned(SlatepyError):
    """The ingestion published nothing: an SST is too old to publish safely (GC may have
    collected it), or gone. Write the SSTs again and publish them promptly."""


@dataclass(frozen=True, slots=True)
class Ingested:
    """A published ingestion: the manifest that holds it and its global seq."""

    manifest_id: int
    global_seq: int
    ssts: int


def write_ingest_ssts(
    store: ObjectStore,
    pairs: Iterable[tuple[bytes, bytes]],
    settings: Settings,
    *,
    target_sst_bytes: int,
) -> list[SstHandle]:
    """Write ``(key, value)`` pairs, keys strictly increasing, as SSTs to publish later.

    Returns their handles (``global_seq`` still 0). Cut at ``target_sst_bytes``.

    Raises:
        InvalidArgument: keys are not strictly increasing, or one is empty.
    """
    handles: list[SstHandle] = []
    builder: SstBuilder | None = None
    last: bytes | None = None
    for key, value in pairs:
        if not key or (last is not None and key <= last):
            raise InvalidArgument(
                f"ingested keys must be non-empty and strictly increasing: {key!r} after {last!r}"
            )
        last = key
        if builder is None:
            builder = SstBuilder(
                writer_epoch=0,
                block_size=settings.block_size,
                bloom_bits_per_key=settings.bloom_bits_per_key,
                compression=settings.compression,
                compression_level=settings.compression_level,
            )
        builder.add(key, 0, value)
        if builder.estimated_size >= target_sst_bytes:
            handles.append(_put_whole(store, builder))
            builder = None
    if builder is not None:
        handles.append(_put_whole(store, builder))
    return handles


def write_ingest_columns(
    store: ObjectStore,
    chunks: Iterable[tuple[list[bytes], list[bytes]]],
    settings: Settings,
    *,
    target_sst_bytes: int,
) -> list[SstHandle]:
    """:func:`write_ingest_ssts` for pairs given as columns, ``(keys, values)`` chunks in
    key order: the same SSTs, cut at the same entries, built in bulk
    (``SstBuilder.extend_below``: the per-entry work in C-level maps), not one :meth:`add`
    per entry (a bulk load's task spent most of its time there).

    Raises:
        InvalidArgument: keys are not strictly increasing, or one is empty.
    """
    handles: list[SstHandle] = []
    output: StreamedSst | None = None
    try:
        for keys, values in chunks:
            if not all(keys):  # in C: an empty key is falsy
                raise InvalidArgument("ingested keys must be non-empty: an empty key")
            seqs = [0] * len(keys)
            begin = 0
            while begin < len(keys):
                if output is not None and output.builder.estimated_size >= target_sst_bytes:
                    handles.append(handle_of(output.id, output.finish()))
                    output = None
                if output is None:
                    # Each SST's builder checks the order of its own keys: across a cut, here.
                    if handles and keys[begin] <= handles[-1].last_key:
                        raise InvalidArgument(
                            f"ingested keys must be strictly increasing: {keys[begin]!r} "
                            f"after {handles[-1].last_key!r}"
                        )
                    output = StreamedSst(
                        store,
                        block_size=settings.block_size,
                        bloom_bits_per_key=settings.bloom_bits_per_key,
                        compression=settings.compression,
                        compression_level=settings.compression_level,
                    )
                begin = _extend(output, keys, seqs, values, begin, limit=target_sst_bytes)
        if output is not None:
            handles.append(handle_of(output.id, output.finish()))
            output = None
    finally:
        if output is not None:
            output.abort()
    return handles


def _extend(
    output: StreamedSst,
    keys: list[bytes],
    seqs: list[int],
    values: list[bytes],
    begin: int,
    *,
    limit: int,
) -> int:
    """Add entries from ``begin`` to ``output`` as a loop of ``add`` that stops before an
    entry once the SST's estimated size reaches ``limit`` would (some at least); return the
    index after the last one added. What surely fits below the limit (and within
    ``SEND_BYTES``) goes in one ``extend``; entries near the limit one block at a time
    (``extend_below``), so the cuts are ``add``'s."""
    builder = output.builder
    room = min(limit - builder.estimated_size, SEND_BYTES)
    fits = begin + _fitting(keys, values, begin, room)
    try:
        if fits > begin:
            builder.extend(keys[begin:fits], seqs[begin:fits], values[begin:fits])
        else:
            fits = builder.extend_below(keys, seqs, values, begin, limit)
    except InvalidArgument as exc:
        raise InvalidArgument(
            f"ingested keys must be non-empty and strictly increasing: {exc}"
        ) from exc
    output.send_if_due()
    return fits


def _fitting(keys: list[bytes], values: list[bytes], begin: int, room: int) -> int:
    """How many entries from ``begin`` surely keep an SST builder's estimated size below
    ``room`` more bytes: their keys and values and :data:`ENTRY_ALLOWANCE` each, within
    seven eighths of it (stored blocks differ from the estimate by their framing)."""
    budget = room * 7 // 8
    if budget <= 0:
        return 0
    rest = len(keys) - begin
    whole = sum(map(len, islice(keys, begin, None))) + sum(map(len, islice(values, begin, None)))
    if whole + ENTRY_ALLOWANCE * rest <= budget:  # the common case: all of them, two sums
        return rest
    sizes = map(
        operator.add, map(len, islice(keys, begin, None)), map(len, islice(values, begin, None))
    )
    ends = accumulate(map(operator.add, sizes, repeat(ENTRY_ALLOWANCE)))
    return bisect_right(list(ends), budget)


ENTRY_ALLOWANCE = 32
"""Bytes an entry is reckoned to add to an SST beyond its key and value, at most."""


def _put_whole(store: ObjectStore, builder: SstBuilder) -> SstHandle:
    encoded = builder.finish()
    return handle_of(put_new_sst(store, encoded.data), encoded)


def delete_ingest_ssts(store: ObjectStore, handles: Sequence[SstHandle]) -> None:
    """Delete written but unpublished SSTs (an aborted load; GC would, later)."""
    for handle in handles:
        store.delete(compacted_path(handle.id))


def global_seq_for(highest: int, last_ingest_seq: int) -> int:
    """The odd seq just above ``highest``, or ``highest`` when it is the previous
    ingestion's (see the module docstring)."""
    if highest and highest == last_ingest_seq:
        return highest
    return highest + 1 if highest % 2 == 0 else highest + 2


def publish_ingest(
    store: ObjectStore, settings: Settings, handles: Sequence[SstHandle]
) -> Ingested:
    """Publish SSTs from :func:`write_ingest_ssts` in one manifest update (see the module
    docstring). Publishing the same SSTs again is a no-op that returns the first result.

    Raises:
        InvalidArgument: no SSTs, or repeated ones.
        NotFound: no database at the store.
        IngestAbandoned: an SST is older than ``gc_min_age / 2`` or missing.
    """
    if not handles:
        raise InvalidArgument("nothing to ingest: no SSTs")
    ids = [h.id for h in handles]
    if len(set(ids)) != len(ids):
        raise InvalidArgument("an SST is named twice in one ingestion")
    manifests = ManifestStore(store, attempts=settings.manifest_update_attempts)
    if manifests.load() is None:
        raise NotFound(f"no slatepy database at {store.url}", path="manifest/")
    written: dict[str, datetime] = {}
    for handle in handles:
        try:
            written[handle.id] = store.head(compacted_path(handle.id)).last_modified
        except NotFound as exc:
            raise IngestAbandoned(f"{exc.path}: an SST to ingest is gone") from exc
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    wal_seqs: dict[int, int] = {}  # WAL SSTs are write-once: read each once across retries
    outcome: list[Ingested] = []

    def ingest(m: Manifest, next_id: int) -> Manifest | None:
        outcome.clear()
        present = {h.id: h for h in m.l0 if h.global_seq}
        if all(i in present for i in ids):  # published already (a retried update landed)
            outcome.append(Ingested(next_id - 1, present[ids[0]].global_seq, len(ids)))
            return None
        now = datetime.now(UTC)
        for sst_id, when in written.items():
            age = (now - when).total_seconds()
            if age > settings.gc_min_age / 2:
                raise IngestAbandoned(
                    f"{compacted_path(sst_id)} was written {age:.0f} s ago, more than "
                    f"gc_min_age / 2 ({settings.gc_min_age / 2:.0f} s): GC may collect it, so "
                    f"it is not published; load again (raise gc_min_age for longer loads)"
                )
        highest = max(m.max_compacted_seq(), m.last_ingest_seq)
        for wal_id in wal.ids(after=m.wal_id_last_compacted):
            if wal_id not in wal_seqs:
                try:
                    wal_seqs[wal_id] = read_wal_sst(wal, wal_id)[0].props.max_seq
                except NotFound:
                    # Compacted and collected since we read the manifest: a newer manifest
                    # exists, so this update's CAS fails and it runs again.
                    wal_seqs[wal_id] = 0
            highest = max(highest, wal_seqs[wal_id])
        g = global_seq_for(highest, m.last_ingest_seq)
        stamped = tuple(msgspec.structs.replace(h, global_seq=g, max_seq=g) for h in handles)
        outcome.append(Ingested(next_id, g, len(handles)))
        return msgspec.structs.replace(m, l0=(*stamped, *m.l0), last_ingest_seq=g)

    manifests.update(ingest)
    return outcome[0]
