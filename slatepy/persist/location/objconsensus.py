"""The default ``Consensus``: numbered create-if-absent objects on the blob store (RFC 0015 §3.2).

Entry ``seqno`` of key ``k`` is the object ``consensus/{k}/{seqno:020}.diff``, created with
``put(mode="create")``: the manifest primitive (RFC 0001), so it works wherever manifests do:
native conditional writes (S3, MinIO, local files, memory) and the DynamoDB two-phase CAS
(RFC 0004), whose LIST completes pending creates first so the head stays linearizable.

Why a create at ``expected + 1`` is a compare-and-set: "``expected`` is the head" is
"the log once reached ``expected`` and ``expected + 1`` does not exist" (entries are only
ever created at head + 1, and truncation removes only entries below the head). The create
checks the second half atomically. The first half is a fact that never becomes false once
true, so this instance remembers the highest seqno it has seen exist per key and checks it
with one HEAD only for an ``expected`` it has never seen (``None`` needs an empty listing).
An ``expected`` below the highest seqno seen is a mismatch without any write: the instance
never re-creates a seqno it has seen taken.

Each object is a small envelope around the caller's bytes: magic ``SLPC``, format version,
seqno, key, data, XXH3-64 checksum. A damaged object, another program's file at an entry's
name, or an entry copied to the wrong seqno is a ``CorruptionError`` naming the object,
never wrong data. Objects whose names are not entry names (the two-phase CAS's temporaries,
strays) are ignored.

Requests (conditional CAS; ``MetricsStore`` counts, see ``tests/persist``):

==========================  ==========================================================
``compare_and_set`` won     1 PUT (+1 HEAD if ``expected`` was never seen here; +1 LIST
                            for ``expected=None``)
``compare_and_set`` lost    1 PUT + 1 GET (the winner's entry is ``Mismatch.current``);
                            1 LIST (+1 GET) if this instance had seen a newer entry
``head``                    1 LIST from the newest seqno seen here, +1 GET if newer
                            (the listing is kept for a scan that starts after it)
``scan``                    1 LIST + one GET per entry (up to 16 in parallel); a scan
                            that starts where the previous one's page ended reuses the
                            rest of that LIST while it holds a full page (no LIST)
``truncate``                1 LIST + one DELETE per entry, ascending
``list_keys``               1 LIST of ``consensus/``
==========================  ==========================================================
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

from slatepy.errors import (
    AlreadyExists,
    ClosedError,
    CorruptionError,
    InvalidArgument,
    NotFound,
    StoreUnavailable,
)
from slatepy.format.checksum import CHECKSUM, CHECKSUM_SIZE, checksum
from slatepy.persist.location.consensus import (
    CasResult,
    Committed,
    Consensus,
    Mismatch,
    VersionedData,
    check_data,
    check_key,
    check_limit,
    check_seqno,
    next_seqno,
)
from slatepy.store.base import ObjectMeta, ObjectStore
from slatepy.store.numbered import parse_id

CONSENSUS_DIR = "consensus"
ENTRY_SUFFIX = ".diff"
ENTRY_MAGIC = b"SLPC"
ENTRY_VERSION = 1
_HEADER = struct.Struct("<4sBQH")  # magic, version, seqno, key length (then key, data, checksum)

DEFAULT_MIN_AGE = 3600.0
"""Seconds an entry's successor must have existed before ``truncate`` deletes the entry."""
READ_PARALLELISM = 16
"""GETs a scan keeps in flight."""
MOVING_ATTEMPTS = 8
"""Re-listings when entries vanish under a read (a truncation racing it) before giving up."""


def entry_path(key: str, seqno: int) -> str:
    """Where entry ``seqno`` of ``key`` lives."""
    return f"{CONSENSUS_DIR}/{key}/{seqno:020d}{ENTRY_SUFFIX}"


def encode_entry(key: str, seqno: int, data: bytes) -> bytes:
    """The object bytes of entry ``seqno`` of ``key`` (deterministic: read-back compares them)."""
    raw_key = key.encode()
    body = b"".join((_HEADER.pack(ENTRY_MAGIC, ENTRY_VERSION, seqno, len(raw_key)), raw_key, data))
    return body + CHECKSUM.pack(checksum(body))


def decode_entry(path: str, raw: bytes, key: str, seqno: int) -> bytes:
    """The data of the entry object ``raw`` read from ``path``, which should be ``key``'s
    entry ``seqno``.

    Raises:
        CorruptionError: not an entry (foreign or truncated), damaged, of a newer format,
            or another entry's bytes; ``path`` names the object.
    """
    if raw[: len(ENTRY_MAGIC)] != ENTRY_MAGIC:
        raise CorruptionError(
            f"{path} is not a slatepy consensus entry (it starts with {bytes(raw[:8])!r}, not "
            f"{ENTRY_MAGIC!r}): something else wrote under {CONSENSUS_DIR}/. Move it away; "
            "the shard cannot be read while it is there",
            path=path,
        )
    if len(raw) < _HEADER.size + CHECKSUM_SIZE:
        raise CorruptionError(f"{path}: {len(raw)} bytes is too short for an entry", path=path)
    body = memoryview(raw)[:-CHECKSUM_SIZE]
    (stored,) = CHECKSUM.unpack_from(raw, len(raw) - CHECKSUM_SIZE)
    if checksum(body) != stored:
        raise CorruptionError(f"{path}: checksum mismatch; the entry is damaged", path=path)
    _, version, found_seqno, key_length = _HEADER.unpack_from(raw)
    if version != ENTRY_VERSION:
        raise CorruptionError(
            f"{path}: entry format version {version} is not one this slatepy reads "
            f"({ENTRY_VERSION}); upgrade slatepy",
            path=path,
        )
    found_key = bytes(body[_HEADER.size : _HEADER.size + key_length]).decode(errors="replace")
    if found_key != key or found_seqno != seqno:
        raise CorruptionError(
            f"{path} holds entry {found_seqno} of {found_key!r}, not entry {seqno} of {key!r}: "
            "it was copied or moved here",
            path=path,
        )
    return bytes(body[_HEADER.size + key_length :])


class ObjectConsensus(Consensus):
    """Consensus on an ``ObjectStore``; see the module docstring.

    Args:
        store: The blob store (normally the client's counted, retrying stack). Not closed by
            :meth:`close`: it belongs to the caller.
        min_age: Seconds an entry's successor must be old (by ``last_modified``) before
            ``truncate`` deletes the entry (RFC 0015 §3.2 (a)). A create of a deleted seqno
            would resurrect it; it can only come from a writer that read the head before the
            successor existed, so this bounds how long such a create must have been in flight.
            Tests pass 0 or a fake ``clock``.
        clock: Wall-clock seconds (``time.time``), compared with the store's ``last_modified``.
        create_attempts: PUT attempts per ``compare_and_set`` after failures that are
            definite, or uncertain and resolved by a read-back that found nothing.
        backoff: Seconds before the second attempt, doubling after each.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        min_age: float = DEFAULT_MIN_AGE,
        clock: Callable[[], float] = time.time,
        create_attempts: int = 3,
        backoff: float = 0.02,
    ) -> None:
        if min_age < 0:
            raise InvalidArgument(f"min_age must be >= 0 seconds, not {min_age!r}")
        if create_attempts < 1:
            raise InvalidArgument(f"create_attempts must be >= 1, not {create_attempts!r}")
        self.store = store
        self.min_age = min_age
        self._clock = clock
        self._attempts = create_attempts
        self._backoff = backoff
        self._lock = threading.Lock()
        # Per key: the newest entry this instance has read or written (what ``head`` lists
        # after), and the highest seqno it has seen exist (what a CAS may build on).
        self._heads: dict[str, VersionedData] = {}
        self._reached: dict[str, int] = {}
        # Per key: seqnos a scan listed beyond its page, for the next page of a catch-up.
        # Without it each page LISTed the whole rest of the log again: a catch-up of n
        # entries cost O(n^2 / page) listed objects (issue 27).
        self._listed: dict[str, list[int]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"ObjectConsensus({self.store.url!r})"

    # Bookkeeping.

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self!r} is closed")

    def _entries(self, key: str, *, after: int | None = None) -> list[tuple[int, ObjectMeta]]:
        """``(seqno, meta)`` of ``key``'s entries above ``after``, ascending: one LIST.

        Only exact entry paths count: not the two-phase CAS's temporaries
        (``….diff.{uuid}.{hash}``), nor anything in a subdirectory, nor other names.
        """
        directory = f"{CONSENSUS_DIR}/{key}/"
        offset = entry_path(key, after) if after is not None else None
        found = []
        for meta in self.store.list(directory, offset=offset):
            name = meta.path[len(directory) :]
            seqno = parse_id(name, ENTRY_SUFFIX) if "/" not in name else None
            if seqno is not None and seqno > (after or 0):
                found.append((seqno, meta))
        return found

    def _ids(self, key: str, *, after: int | None = None) -> list[int]:
        return [seqno for seqno, _ in self._entries(key, after=after)]

    def _saw(self, key: str, entry: VersionedData | None = None, *, reached: int = 0) -> None:
        """Remember that ``key``'s log reached ``entry.seqno`` (and ``reached``)."""
        with self._lock:
            if entry is not None:
                cached = self._heads.get(key)
                if cached is None or cached.seqno < entry.seqno:
                    self._heads[key] = entry
                reached = max(reached, entry.seqno)
            if reached > self._reached.get(key, 0):
                self._reached[key] = reached

    def _read(self, key: str, seqno: int) -> bytes:
        """The data of entry ``seqno`` (``NotFound`` if it does not exist)."""
        path = entry_path(key, seqno)
        return decode_entry(path, self.store.get(path), key, seqno)

    # Reads.

    def head(self, key: str) -> VersionedData | None:
        check_key(key)
        self._check_open()
        for _ in range(MOVING_ATTEMPTS):
            with self._lock:
                cached = self._heads.get(key)
            # The cached entry stays the head until something newer exists (heads are never
            # deleted), so only newer entries need listing.
            ids = self._ids(key, after=cached.seqno if cached is not None else None)
            if not ids:
                return cached
            if len(ids) > 1 and cached is not None and ids[0] == cached.seqno + 1:
                with self._lock:  # the catch-up that follows scans from there: no LIST
                    self._listed[key] = ids
            try:
                entry = VersionedData(ids[-1], self._read(key, ids[-1]))
            except NotFound:
                continue  # a newer entry arrived and a truncation took this one: list again
            self._saw(key, entry)
            return entry
        raise StoreUnavailable(
            f"head of consensus key {key!r}: the newest entry vanished {MOVING_ATTEMPTS} times "
            "in a row (a truncation with min_age=0 racing appends?); try again",
            path=f"{CONSENSUS_DIR}/{key}/",
        )

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        check_key(key)
        check_seqno(from_seqno, "from_seqno", minimum=0)
        check_limit(limit)
        self._check_open()
        after = from_seqno - 1 if from_seqno > 1 else None
        gaps: set[tuple[int, int]] = set()
        for attempt in range(MOVING_ATTEMPTS):
            with self._lock:
                listed = self._listed.pop(key, None)
            if attempt == 0 and listed and listed[0] == from_seqno and len(listed) >= limit:
                ids, rest = listed[:limit], listed[limit:]
            else:
                ids = self._ids(key, after=after)
                ids, rest = ids[:limit], ids[limit:]
            gap = next(((lo, up) for lo, up in pairwise(ids) if up != lo + 1), None)
            if gap is not None:
                lower, upper = gap
                # A LIST is no snapshot (a directory scan in directory order, S3's pages):
                # one racing a truncation may miss an entry it deleted and still show the
                # one below (deleted first: gone now), and one racing creates may miss an
                # entry and show the next (there on the next LIST). List again; a gap seen
                # twice, its lower entry still there, is real.
                if gap not in gaps or not self._exists(entry_path(key, lower)):
                    gaps.add(gap)
                    continue
                # Entries are created only at head + 1 and deleted from the bottom, so a
                # gap means an entry below it was created after a truncation took its
                # seqno (RFC 0015 §3.2): refuse to hand it out as part of the log.
                raise CorruptionError(
                    f"consensus log {key!r} has a gap: {entry_path(key, lower)} is followed "
                    f"by {entry_path(key, upper)}. The entry below the gap was written "
                    "after a truncation deleted its seqno (a stalled writer); a truncate "
                    f"past {upper} removes it",
                    path=entry_path(key, lower),
                )
            try:
                datas = self._read_many(key, ids)
            except NotFound:
                continue  # a truncation racing us took the bottom entries: list again
            entries = [VersionedData(s, d) for s, d in zip(ids, datas, strict=True)]
            if entries:
                self._saw(key, reached=entries[-1].seqno)
            if rest and ids and rest[0] == ids[-1] + 1:
                with self._lock:
                    self._listed[key] = rest
            return entries
        raise StoreUnavailable(
            f"scan of consensus key {key!r}: entries kept vanishing under a truncation; try again",
            path=f"{CONSENSUS_DIR}/{key}/",
        )

    def _exists(self, path: str) -> bool:
        try:
            self.store.head(path)
        except NotFound:
            return False
        return True

    def _read_many(self, key: str, ids: list[int]) -> list[bytes]:
        if len(ids) <= 1:
            return [self._read(key, seqno) for seqno in ids]
        with self._lock:
            if self._closed:
                raise ClosedError(f"{self!r} is closed")  # no pool may outlive close()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    READ_PARALLELISM, thread_name_prefix="slatepy-consensus-read"
                )
            pool = self._pool
        return list(pool.map(lambda seqno: self._read(key, seqno), ids))

    def list_keys(self) -> list[str]:
        self._check_open()
        keys = set()
        for meta in self.store.list(f"{CONSENSUS_DIR}/"):
            parts = meta.path.split("/")
            if len(parts) == 3 and parse_id(parts[2], ENTRY_SUFFIX) is not None:
                keys.add(parts[1])
        return sorted(keys)

    # Writes.

    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CasResult:
        check_key(key)
        seqno = next_seqno(expected)
        check_data(data)
        self._check_open()
        mismatch = self._check_expected(key, expected)
        if mismatch is not None:
            return mismatch
        path = entry_path(key, seqno)
        body = encode_entry(key, seqno, data)
        uncertain = False
        error: StoreUnavailable | None = None
        for attempt in range(self._attempts):
            if attempt:
                time.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                self.store.put(path, body, mode="create")
            except AlreadyExists:
                return self._lost(key, seqno, body, uncertain=uncertain)
            except StoreUnavailable as exc:
                error = exc
                if exc.definite:
                    continue  # nothing was written: try again
                uncertain = True
                resolved = self._read_back(key, seqno, body, exc)
                if resolved is not None:
                    return resolved
                # Not there (yet): creating the same bytes again is safe. If the first PUT
                # lands later, one of the two gets "already exists" and changes nothing.
                continue
            self._saw(key, VersionedData(seqno, data))
            return Committed()
        raise StoreUnavailable(
            f"compare_and_set of {path} failed {self._attempts} times; last: {error}"
            + (
                " (an attempt may still land: read the head before writing again)"
                if uncertain
                else ""
            ),
            path=path,
            definite=not uncertain,
        ) from error

    def _check_expected(self, key: str, expected: int | None) -> Mismatch | None:
        """A ``Mismatch`` if ``expected`` cannot be the head for a reason the create itself
        would not catch; ``None`` if the create decides.

        * ``expected=None``: the log must be empty (one LIST, or nothing if this instance
          has seen an entry).
        * ``expected`` below the highest seqno seen here: ``expected + 1`` existed, so it is
          taken for good. Answered without writing: if a truncation had deleted it, a create
          would succeed and resurrect it.
        * ``expected`` above it: the log must have reached ``expected`` (one HEAD).
        """
        with self._lock:
            reached = self._reached.get(key, 0)
        if expected is None:
            if reached or self._ids(key):
                return Mismatch(self.head(key))
            return None
        if expected < reached:
            return Mismatch(self.head(key))
        if expected == reached:
            return None
        try:
            self.store.head(entry_path(key, expected))
        except NotFound:
            # Either the log never reached ``expected``, or a truncation deleted it, which
            # happens only below the head: either way it is not the head.
            return Mismatch(self.head(key))
        self._saw(key, reached=expected)
        return None

    def _lost(self, key: str, seqno: int, body: bytes, *, uncertain: bool) -> CasResult:
        """The create of entry ``seqno`` found it taken: ours (an earlier attempt of this
        call landed) or another writer's."""
        path = entry_path(key, seqno)
        try:
            existing = self.store.get(path)
        except NotFound:
            if uncertain:
                raise StoreUnavailable(
                    f"compare_and_set of {path}: an attempt of ours may have landed, but the "
                    "entry was truncated before it could be read back, so whose it was is "
                    "unknown; read the head before writing again",
                    path=path,
                    definite=False,
                ) from None
            return Mismatch(self.head(key))  # taken, then truncated: far behind the head
        except StoreUnavailable as exc:
            raise self._unresolved(path, exc, uncertain=uncertain) from exc
        if existing == body:
            self._saw(key, VersionedData(seqno, decode_entry(path, existing, key, seqno)))
            return Committed()
        winner = VersionedData(seqno, decode_entry(path, existing, key, seqno))
        self._saw(key, winner)
        return Mismatch(winner)

    def _read_back(
        self, key: str, seqno: int, body: bytes, failure: StoreUnavailable
    ) -> CasResult | None:
        """Resolve an uncertain create of entry ``seqno``: ``Committed`` if our bytes are
        there, ``Mismatch`` if another's are, ``None`` if nothing is (yet)."""
        path = entry_path(key, seqno)
        try:
            existing = self.store.get(path)
        except NotFound:
            return None
        except StoreUnavailable as exc:
            raise self._unresolved(path, exc, uncertain=True, first=failure) from exc
        entry = VersionedData(seqno, decode_entry(path, existing, key, seqno))
        self._saw(key, entry)
        return Committed() if existing == body else Mismatch(entry)

    @staticmethod
    def _unresolved(
        path: str,
        exc: StoreUnavailable,
        *,
        uncertain: bool,
        first: StoreUnavailable | None = None,
    ) -> StoreUnavailable:
        return StoreUnavailable(
            f"compare_and_set of {path}: "
            + (f"the write's outcome is unknown ({first}) and " if first is not None else "")
            + f"reading the entry back failed ({exc}); read the head before writing again",
            path=path,
            definite=not uncertain,
        )

    def truncate(self, key: str, seqno: int) -> int:
        check_key(key)
        check_seqno(seqno, "seqno")
        self._check_open()
        entries = self._entries(key)
        head = entries[-1][0] if entries else None
        if head is None or seqno > head:
            raise InvalidArgument(
                f"truncate({key!r}, {seqno}): the head is {head}; truncating above the head "
                "would delete it"
            )
        self._saw(key, reached=head)
        with self._lock:
            self._listed.pop(key, None)
        cutoff = self._clock() - self.min_age
        deleted = 0
        for (current, _), (_, successor) in pairwise(entries):
            if current >= seqno:
                break
            if self.min_age and successor.last_modified.timestamp() > cutoff:
                break  # too young: this and everything above stays (the log stays contiguous)
            # One at a time, ascending: a crash leaves a contiguous suffix.
            self.store.delete(entry_path(key, current))
            deleted += 1
        return deleted

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
