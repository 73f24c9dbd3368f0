"""Contiguous numbered objects: ``{directory}/{id:020}{suffix}``.

Manifests and WAL SSTs are both sequences of write-once objects with u64 ids formatted as
20 zero-padded digits, so lexicographic order is numeric order and a listing from an offset
finds everything newer than what a caller already knows.
"""

from __future__ import annotations

from slatepy.errors import NotFound
from slatepy.store.base import ObjectMeta, ObjectStore, PutData
from slatepy.store.cas import create_if_absent

ID_DIGITS = 20


def parse_id(path: str, suffix: str) -> int | None:
    """The id in a numbered object's ``path``, or None for anything else (temporaries, strays)."""
    name = path.rsplit("/", 1)[-1]
    digits = name[: -len(suffix)] if name.endswith(suffix) else ""
    if len(digits) != ID_DIGITS or not digits.isdigit():
        return None
    return int(digits)


def contiguous_end(ids: list[int], first: int) -> int:
    """The first id from ``first`` on that ``ids`` (ascending) does not contain."""
    expected = first
    for object_id in ids:
        if object_id == expected:
            expected += 1
        elif object_id > expected:
            break
    return expected


class NumberedObjects:
    """One numbered sequence in a store (e.g. ``wal/…sst`` or ``manifest/…manifest``)."""

    def __init__(self, store: ObjectStore, directory: str, suffix: str) -> None:
        self.store = store
        self.directory = directory
        self.suffix = suffix

    def path(self, object_id: int) -> str:
        return f"{self.directory}/{object_id:0{ID_DIGITS}d}{self.suffix}"

    def parse(self, path: str) -> int | None:
        return parse_id(path, self.suffix)

    def entries(self, *, after: int | None = None) -> list[tuple[int, ObjectMeta]]:
        """``(id, meta)`` of every object in the sequence with id > ``after``, ascending.

        Ascending because ``ObjectStore.list`` is sorted by path and ids are zero-padded.
        """
        offset = self.path(after) if after is not None else None
        found = []
        for meta in self.store.list(self.directory + "/", offset=offset):
            object_id = self.parse(meta.path)
            if object_id is not None and (after is None or object_id > after):
                found.append((object_id, meta))
        return found

    def ids(self, *, after: int | None = None) -> list[int]:
        return [object_id for object_id, _ in self.entries(after=after)]

    def latest(self, *, after: int | None = None) -> int | None:
        found = self.ids(after=after)
        return found[-1] if found else None

    def contiguous_tail(self, after: int) -> int | None:
        """The highest id of the gap-free run of ids following ``after`` (None if ``after + 1``
        does not exist)."""
        end = contiguous_end(self.ids(after=after), after + 1)
        return end - 1 if end > after + 1 else None

    def read(self, object_id: int) -> bytes:
        return self.store.get(self.path(object_id))

    def probe(self, object_id: int) -> bytes | None:
        """Object ``object_id``'s bytes, or None if it does not exist: one GET either way.

        How a poller asks "is there a next one?" cheaply: a GET of a missing object costs a
        GET, a listing costs a LIST, about twelve times as much on S3 (and lists in pages).
        """
        try:
            return self.read(object_id)
        except NotFound:
            return None

    def exists(self, object_id: int) -> bool:
        """Whether object ``object_id`` exists (one HEAD)."""
        try:
            self.store.head(self.path(object_id))
        except NotFound:
            return False
        return True

    def create(self, object_id: int, data: PutData, *, attempts: int = 5) -> bytes | None:
        """Create-if-absent; see :func:`slatepy.store.cas.create_if_absent`."""
        return create_if_absent(self.store, self.path(object_id), data, attempts=attempts)
