"""The manifest record and the pure transitions on it.

A manifest is immutable once written; every change is a function ``Manifest -> Manifest``
applied to the latest manifest and written to the next id (see ``store.py``).
Encoding: msgpack (msgspec) inside a checksummed envelope with magic ``SLPM``. Format
version 2 (RFC 0006, issue 33 addendum) encodes SST handles and sorted runs as msgpack
arrays of their fields in declaration order instead of maps (field names repeated per
handle were 40% of a large manifest); version 1 manifests still decode.
"""

from __future__ import annotations

import msgspec

from slatepy.errors import CorruptionError
from slatepy.format.checksum import CHECKSUM, checksum
from slatepy.format.envelope import HEADER, unseal
from slatepy.format.kinds import RangeTombstone
from slatepy.format.sst import EncodedSst

MANIFEST_MAGIC = b"SLPM"
MANIFEST_FORMAT_VERSION = 2
"""The version written. 1: handles and runs as maps (still read, see ``_decode_v1``)."""
MANIFEST_V1 = 1


class SstHandle(msgspec.Struct, frozen=True, array_like=True):
    """A compacted SST the manifest references (under ``compacted/``).

    Encoded as an array of its fields in this order (format version 2): a field added
    later goes last, with a default, so that older arrays decode (and an older slatepy
    ignores the extra trailing element).

    ``max_seq`` lets a new writer continue sequence numbers above everything compacted.

    ``global_seq`` (0: none) is the sequence number of every entry of an *ingested* SST
    (built outside the writer, published by ``engine.ingest``; RFC 0016): its entries are
    stored with seq 0 and readers stamp them with it. Only L0 holds such handles; compaction
    writes the stamped seqs into its outputs.
    """

    id: str
    object_size: int
    first_key: bytes
    last_key: bytes
    entry_count: int
    max_seq: int = 0
    global_seq: int = 0
    range_tombstones: tuple[RangeTombstone, ...] = ()
    """The SST's range tombstones (a copy of its properties'; RFC 0019), so that a reader
    holds every range tombstone of its view without opening an SST."""


def handle_of(sst_id: str, encoded: EncodedSst) -> SstHandle:
    """The handle of the SST ``encoded`` written as ``compacted/{sst_id}``."""
    props = encoded.meta.props
    first, last = props.first_key, props.last_key
    if first is None or last is None:
        # Range tombstones only: the handle needs a key range; the tombstones' first start
        # serves (reads find range tombstones through the handle's list, not by key).
        assert props.range_tombstones, "an SST with neither entries nor range tombstones"
        first = last = props.range_tombstones[0].start
    return SstHandle(
        sst_id,
        encoded.meta.object_size,
        first,
        last,
        props.entry_count,
        props.max_seq,
        range_tombstones=props.range_tombstones,
    )


class SortedRun(msgspec.Struct, frozen=True, array_like=True):
    """Key-range-partitioned SSTs forming one sorted run (an array, as :class:`SstHandle`)."""

    id: int
    ssts: tuple[SstHandle, ...]


CHECKPOINT = "checkpoint"
"""``Snapshot.kind`` of a checkpoint; readers' and writers' snapshots are ``"snapshot"``."""
CLONE_CHECKPOINT_PREFIX = "clone:"
"""A checkpoint named ``clone:{url}`` is held by the clone at ``url`` (RFC 0017): the
clone's GC releases it once the clone reads nothing of this database any more."""


def clone_of(snapshot_name: str) -> str | None:
    """The URL of the clone holding a checkpoint of this name, None if it is no clone's."""
    if snapshot_name.startswith(CLONE_CHECKPOINT_PREFIX):
        return snapshot_name[len(CLONE_CHECKPOINT_PREFIX) :]
    return None


class Snapshot(msgspec.Struct, frozen=True):
    """A reference that keeps the manifest ``manifest_id`` (and what it reaches) alive.

    ``expire_time_s`` is UTC epoch seconds; 0 means the snapshot never expires.

    A *checkpoint* (``kind="checkpoint"``, RFC 0017) is a snapshot a user created and names:
    it holds the manifest and the WAL SSTs after its ``wal_id_last_compacted`` up to
    ``wal_id`` (the WAL prefix the checkpoint covers), until deleted or expired. Reader and
    writer snapshots leave the fields added with it at their defaults. They were added after
    format version 1 shipped, with defaults: older manifests decode as plain snapshots, and
    an older slatepy rewriting a manifest keeps a checkpoint as an anonymous snapshot (it
    still protects its manifest from GC), so no version bump.
    """

    id: str
    manifest_id: int
    expire_time_s: int
    # A str, not a Literal: a kind added later must not make this version's decode fail;
    # an unknown kind protects like a plain snapshot.
    kind: str = "snapshot"
    name: str = ""
    wal_id: int = 0
    create_time_s: int = 0

    def expired(self, now_s: float) -> bool:
        return self.expire_time_s != 0 and self.expire_time_s < now_s


class ExternalDb(msgspec.Struct, frozen=True):
    """SSTs a clone reads from another database's store (RFC 0017).

    A clone's manifest references compacted SSTs of its source without copying them:
    ``sst_ids`` live under ``compacted/`` at ``url``, held there by the source's checkpoint
    ``checkpoint_id`` (of the source's manifest ``manifest_id``). Reads of those ids go to
    ``url``; the clone writes, compacts into and collects only its own store.
    """

    url: str
    checkpoint_id: str
    manifest_id: int
    sst_ids: tuple[str, ...]


class CompactorLease(msgspec.Struct, frozen=True):
    """Who holds ``compactor_epoch`` and how a waiting compactor tells that it is still there.

    The holder bumps ``renewals`` (and stamps ``renewed_s``) with every compaction it publishes
    and, during a long compaction, every ``duration_s / 3``. A standby compactor takes the
    epoch over only after watching work stay pending with nothing about the holder changing
    for ``duration_s`` of its *own* clock, so clock skew cannot hand the epoch over early
    (RFC 0013). ``renewed_s`` (the holder's wall clock) is for humans and the advisory check
    of ``slatepy compact`` without ``--force``. A lease whose ``epoch`` is not the manifest's
    ``compactor_epoch`` is stale (a compactor of an older slatepy claimed without one).
    """

    epoch: int
    holder: str
    renewals: int
    renewed_s: float
    duration_s: float


class SstOptions(msgspec.Struct, frozen=True):
    """How the database's writer wants its SSTs built (RFC 0026): recorded in the manifest
    by every writer at open, so that a compactor in another process (``slatepy compact``,
    ``slatepy compactor``) writes its outputs the same way instead of by its own process's
    defaults. Blocks say how they are compressed, so any SST stays readable whatever these
    are; they decide what compaction writes, not what an SST means to a reader.

    Fields as in ``Settings`` (``compression`` a str, not a Literal: a codec added later must
    not make an older slatepy's decode fail; an unknown one is ignored by it, see
    ``Compactor``).
    """

    compression: str = "none"
    compression_level: int = 0
    block_size: int = 4096
    bloom_bits_per_key: int = 10


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """The durable state of a database (fields as in the manifest seed).

    ``update_id`` is a random token stamped on every write, so that two updaters producing
    otherwise identical manifests can still tell whose create landed.

    Invariants:
        * ``wal_id_last_compacted <= wal_id_last_seen``.
        * WAL SSTs with id > ``wal_id_last_compacted`` are not yet in ``l0``/``sorted_runs``.
        * ``writer_epoch`` and ``compactor_epoch`` only grow.
        * ``last_compacted_seq`` only grows and is at least every compacted SST's
          ``max_seq``; it keeps the sequence numbers of tombstones that compaction dropped,
          so a new writer never reuses them (see :meth:`max_compacted_seq`).
        * ``max_parallel_writes`` is the fence width the next writer must use: the widest
          in-flight window any writer since the last completed fence may have had. It is
          only lowered by a writer that completed a fence at least that wide.
    """

    format_version: int = MANIFEST_FORMAT_VERSION
    update_id: str = ""
    writer_epoch: int = 0
    compactor_epoch: int = 0
    wal_id_last_compacted: int = 0
    wal_id_last_seen: int = 0
    max_parallel_writes: int = 1
    last_compacted_seq: int = 0
    l0: tuple[SstHandle, ...] = ()
    sorted_runs: tuple[SortedRun, ...] = ()
    snapshots: tuple[Snapshot, ...] = ()
    # Optional, added after format version 1 shipped: manifests without it decode with None,
    # and older slatepy ignores it (msgspec skips unknown fields), so no version bump.
    compactor_lease: CompactorLease | None = None
    # The global seq of the latest ingestion (odd; 0: none yet). Writers assign even seqs
    # (RFC 0016), so an ingestion sits strictly between the writes before and after it.
    last_ingest_seq: int = 0
    # Optional, added after format version 1 (RFC 0017): the SSTs of a clone that live in
    # its source's store. Older slatepy cannot read a clone (it looks for them locally).
    external_dbs: tuple[ExternalDb, ...] = ()
    # Optional, added after format version 1 (RFC 0026): the writer's SST options. Older
    # manifests decode with None (compactors then use their own settings, as before), and
    # older slatepy skips the field, so no version bump: nothing it reads means otherwise.
    sst_options: SstOptions | None = None

    def encode(self) -> bytes:
        """The manifest in its envelope (``slatepy.format.envelope``'s layout), encoded into
        one buffer after the header and checksummed in place: one copy of a large
        manifest's bytes instead of the three of ``seal`` (16 MiB at 100,000 SSTs).

        Always the current format version, whatever version ``self`` was read from."""
        current = self
        if current.format_version != MANIFEST_FORMAT_VERSION:
            current = msgspec.structs.replace(self, format_version=MANIFEST_FORMAT_VERSION)
        buffer = bytearray(HEADER.pack(MANIFEST_MAGIC, MANIFEST_FORMAT_VERSION))
        _ENCODER.encode_into(current, buffer, HEADER.size)
        buffer += CHECKSUM.pack(checksum(buffer))
        return bytes(buffer)

    @staticmethod
    def decode(data: bytes) -> Manifest:
        """Decode and verify a manifest (format version 1 or 2); ``format_version`` is the
        version it was stored as.

        Raises:
            CorruptionError: it is damaged.
            UnsupportedFormatVersion: a newer slatepy wrote it (nothing is damaged).
        """
        version, payload = unseal(
            data, MANIFEST_MAGIC, (MANIFEST_V1, MANIFEST_FORMAT_VERSION), "manifest"
        )
        try:
            decode = _decode_v1 if version == MANIFEST_V1 else _DECODER.decode
            manifest = decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CorruptionError(f"manifest: cannot decode: {exc}") from exc
        if manifest.wal_id_last_compacted > manifest.wal_id_last_seen:
            raise CorruptionError("manifest: wal_id_last_compacted > wal_id_last_seen")
        return manifest

    def max_compacted_seq(self) -> int:
        """The highest sequence number compaction ever folded in, dropped tombstones included.

        A new writer starts above it (and above the WAL it replays): reusing a sequence
        number would let a reader's prune (by sequence number) drop a newer write.
        """
        handles = [*self.l0, *(h for run in self.sorted_runs for h in run.ssts)]
        return max([self.last_compacted_seq, *(h.max_seq for h in handles)])

    def l0_has_ingested(self) -> bool:
        """Whether an L0 SST is ingested (its seqs need not follow L0's order)."""
        return any(h.global_seq for h in self.l0)

    def with_snapshot(self, snapshot: Snapshot) -> Manifest:
        return msgspec.structs.replace(self, snapshots=(*self.snapshots, snapshot))

    def without_snapshot(self, snapshot_id: str) -> Manifest:
        kept = tuple(s for s in self.snapshots if s.id != snapshot_id)
        return msgspec.structs.replace(self, snapshots=kept)

    def without_expired_snapshots(self, now_s: float) -> Manifest:
        kept = tuple(s for s in self.snapshots if not s.expired(now_s))
        return msgspec.structs.replace(self, snapshots=kept)

    def with_writer_epoch(self, epoch: int) -> Manifest:
        return msgspec.structs.replace(self, writer_epoch=epoch)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Manifest)
_HANDLE_FIELDS = msgspec.structs.fields(SstHandle)


def _decode_v1(payload: bytes) -> Manifest:
    """A format version 1 manifest (handles and runs as maps), as today's types: the maps
    are turned into the arrays version 2 encodes, then converted (with the same type checks
    as a version 2 decode). Once per old database: its next update writes version 2.

    Raises:
        msgspec.DecodeError, msgspec.ValidationError: not a valid version 1 manifest.
    """
    raw = msgspec.msgpack.decode(payload)
    if not isinstance(raw, dict):
        raise msgspec.ValidationError("Expected `object`, got a manifest of another shape")
    try:
        if "l0" in raw:
            raw["l0"] = [_handle_row(h) for h in raw["l0"]]
        if "sorted_runs" in raw:
            raw["sorted_runs"] = [
                [r["id"], [_handle_row(h) for h in r["ssts"]]] for r in raw["sorted_runs"]
            ]
    except (KeyError, TypeError) as exc:
        raise msgspec.ValidationError(
            f"version 1 manifest: bad SST handle or run: {exc!r}"
        ) from exc
    raw["format_version"] = MANIFEST_V1  # as stored (``encode`` writes the current one)
    return msgspec.convert(raw, Manifest)


def _handle_row(handle: dict[str, object]) -> list[object]:
    """A version 1 handle (a map) as version 2's array; a missing required field raises
    KeyError, a missing optional one takes its default."""
    return [handle[f.name] if f.required or f.name in handle else f.default for f in _HANDLE_FIELDS]
