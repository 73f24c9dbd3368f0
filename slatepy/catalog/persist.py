"""The catalog in one persist shard (RFC 0028 §3.1, the seed's persist implementation).

Each row is one persist update: key ``collection NUL key-JSON``, value the value JSON, time
the catalog's upper, diff ±1. The epoch is a row of the hidden collection ``_fence`` (value
``{"epoch": N, "holder": "host:pid"}``), written together with an open's other changes.
Every write is one ``compare_and_append`` at the expected upper: as every open writes, a
commit of an older leader always finds a moved upper, which is its fence (the newer epoch is
then read for the message). A read is a snapshot at ``upper - 1`` of the state at the
consensus head that registers nothing (``PersistClient.snapshot_latest``): reads write
nothing, so they neither cost writes nor move the seqno a leader's next compare-and-set
expects. An open downgrades the critical since ``catalog`` to ``upper - 1`` so
compaction can consolidate the history below it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import msgspec

from slatepy.catalog.errors import CatalogError
from slatepy.catalog.objects import COLLECTIONS
from slatepy.catalog.storage import Contents, Row, Storage, fenced_message
from slatepy.errors import FencedError, SlatepyError
from slatepy.persist import PersistClient, Update, UpperMismatch, WriteHandle

log = logging.getLogger(__name__)
FENCE = "_fence"
"""The hidden collection of the epoch row (never returned by a read's entries)."""
CRITICAL_READER = "catalog"
_NAME = re.compile(r"[a-z][a-z0-9_]*")
"""What a collection's name looks like (this version's, or a newer one's)."""


class _Fence(msgspec.Struct):
    epoch: int
    holder: str = ""


def _key(collection: str, key: bytes) -> bytes:
    return collection.encode() + b"\x00" + key


class PersistStorage(Storage):
    """A catalog in shard ``shard`` of ``client``.

    Args:
        owns_client: Close ``client`` with this storage.
    """

    def __init__(
        self, client: PersistClient, shard: str, *, owns_client: bool, description: str
    ) -> None:
        self._client = client
        self._shard = shard
        self._owns_client = owns_client
        self.description = description
        self._writer: WriteHandle | None = None
        self._fence_row: bytes | None = None

    def _handle(self) -> WriteHandle:
        if self._writer is None:
            self._writer = self._client.open_writer(self._shard, purpose="catalog")
        return self._writer

    def upper(self) -> int:
        """The shard's upper.

        Raises:
            CatalogError: the shard is closed (its upper empty): a catalog never is, so it
                is another shard, or one closed by hand.
        """
        upper = self._client.machine(self._shard).fetch(maintain=False).upper
        if upper is None:
            raise self._closed()
        return upper

    def _closed(self) -> CatalogError:
        return CatalogError(
            f"{self.description} is closed (its upper is empty): not a catalog, or one "
            "closed by hand"
        )

    def read(self) -> Contents:
        upper, updates = self._client.snapshot_latest(self._shard)  # registers nothing
        if upper is None:
            raise self._closed()
        if upper == 0:
            self._fence_row = None
            return Contents(0, 0, [])
        return self._contents(upper, updates)

    def _contents(self, upper: int, updates: Iterable[Update]) -> Contents:
        """The catalog in a snapshot; a shard written by anything else (no fence row, or a
        row of no collection) is refused, so that nothing reads or edits it as one.

        Raises:
            CatalogError: the shard holds something other than a catalog.
        """
        entries: list[tuple[str, bytes, bytes]] = []
        fence_row = None
        fences = 0
        foreign = False
        for (key, value), _, diff in updates:
            coll, nul, k = key.partition(b"\x00")
            name = coll.decode(errors="replace")
            if diff != 1:
                raise CatalogError(f"{self.description}: corrupt: row {key!r} counts {diff}")
            if name == FENCE:
                fence_row, fences = value, fences + 1
            elif nul and (name in COLLECTIONS or _NAME.fullmatch(name)):
                # An unknown name is a newer version's collection (the version check
                # refuses the catalog) or corruption (the open's check names it).
                entries.append((name, k, value))
            else:
                foreign = True
        if fence_row is None or foreign:
            raise CatalogError(f"{self.description} holds something that is not a catalog")
        if fences > 1:
            raise CatalogError(f"{self.description}: corrupt: it holds {fences} fence rows")
        self._fence_row = fence_row
        try:
            fence = msgspec.json.decode(fence_row, type=_Fence)
        except msgspec.DecodeError as exc:
            raise CatalogError(
                f"{self.description}: corrupt: its fence row does not decode ({exc})"
            ) from None
        return Contents(upper, fence.epoch, entries, fence.holder)

    def write(
        self,
        rows: list[Row],
        *,
        expected_upper: int,
        epoch: int | None,
        new_epoch: int | None = None,
        holder: str = "",
    ) -> int:
        updates: list[Update] = [((_key(c, k), v), expected_upper, d) for c, k, v, d in rows]
        fence_row = self._fence_row
        if new_epoch is not None:
            new_row = msgspec.json.encode(_Fence(new_epoch, holder))
            if fence_row is not None:
                updates.append(((_key(FENCE, b"{}"), fence_row), expected_upper, -1))
            updates.append(((_key(FENCE, b"{}"), new_row), expected_upper, 1))
            fence_row = new_row
        try:
            self._handle().compare_and_append(updates, expected_upper, expected_upper + 1)
        except UpperMismatch as exc:
            raise self._fenced(epoch, expected_upper, exc.current) from None
        self._fence_row = fence_row
        if new_epoch is not None:
            try:
                self._downgrade_since(expected_upper)
            except SlatepyError as exc:  # the open landed: a compaction hint must not fail it
                log.warning("%s: the critical since stays behind (%s)", self.description, exc)
        return expected_upper + 1

    def _downgrade_since(self, since: int) -> None:
        hold = self._client.open_critical_since(self._shard, CRITICAL_READER)
        opaque = hold.opaque
        if hold.since is not None and hold.since < since:
            hold.compare_and_downgrade_since(opaque, opaque, since)

    def _fenced(self, epoch: int | None, expected: int, current: int | None) -> FencedError:
        # Only a leader's message names the newer epoch (a debug write's names the upper).
        newest = self.read().epoch if current and epoch is not None else 0
        return FencedError(
            f"catalog {self.description}: "
            + fenced_message(epoch, newest, expected, -1 if current is None else current)
        )

    def confirm(self, upper: int, epoch: int) -> None:
        current = self.upper()
        if current != upper:
            raise self._fenced(epoch, upper, current)

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()  # expires it only if an append may have registered it
        if self._owns_client:
            self._client.close()
