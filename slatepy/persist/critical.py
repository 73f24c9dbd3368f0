"""Critical since holds (RFC 0015 §7.5): a since without a lease, guarded by an opaque
fencing token the caller chooses (e.g. a controller's epoch), registered once per
``(shard, reader id)``. It never expires by itself and reads nothing; it only keeps the
shard's since from passing its own.
"""

from __future__ import annotations

import threading

from slatepy.closing import Closing
from slatepy.errors import ClosedError
from slatepy.persist.errors import OpaqueMismatch
from slatepy.persist.frontier import Frontier
from slatepy.persist.machine import ShardMachine, rerun_as_is
from slatepy.persist.state.records import CriticalReader
from slatepy.persist.state.transitions import (
    CompareAndDowngradeSince,
    ExpireCriticalReader,
    compare_and_downgrade_since,
    expire_critical_reader,
)
from slatepy.persist.validate import check_frontier


class SinceHandle(Closing):
    """A critical since hold on one shard. Open with ``PersistClient.open_critical_since``.

    Attributes:
        shard_id: The shard.
        reader_id: The caller's id for this hold (opening it again returns the same hold).
    """

    def __init__(self, machine: ShardMachine, reader_id: str, reader: CriticalReader) -> None:
        self.shard_id = machine.shard_id
        self.reader_id = reader_id
        self._machine = machine
        self._since = reader.since
        self._opaque = reader.opaque
        self._lock = threading.Lock()
        self._expired = False
        self._closed = False

    @property
    def since(self) -> Frontier:
        """The hold's since as this handle last saw it."""
        return self._since

    @property
    def opaque(self) -> bytes:
        """The opaque token stored with the hold as this handle last saw it (``b""`` when
        first registered)."""
        return self._opaque

    @property
    def closed(self) -> bool:
        """Whether the handle was closed (or expired): it is unusable."""
        return self._closed or self._expired

    def compare_and_downgrade_since(
        self, expected_opaque: bytes, new_opaque: bytes, new_since: Frontier
    ) -> Frontier:
        """If the stored opaque is ``expected_opaque``: store ``new_opaque`` and move the
        since forward to ``new_since`` (a smaller one leaves the since, but the opaque is
        still stored). Answers the hold's since.

        Raises:
            OpaqueMismatch: the stored opaque differs (nothing changed; ``.current`` is it).
            UsageError: opaques not bytes, ``new_since`` not an int or None, or the hold was
                expired.
        """
        check_frontier(new_since, "new since")
        with self._lock:
            self._check_live()
            args = CompareAndDowngradeSince(self.reader_id, expected_opaque, new_opaque, new_since)
            try:
                # Not rerun blindly after an uncertain attempt: a landed one changed the
                # opaque, so a rerun would report a mismatch for our own change.
                self._since = self._machine.run(compare_and_downgrade_since, args)
            except OpaqueMismatch as exc:
                self._opaque = exc.current
                raise
            self._opaque = new_opaque
            return self._since

    def expire(self) -> None:
        """Remove the hold (one state change), releasing its since. Idempotent."""
        with self._lock:
            if self._expired:
                return
            # Marked only once committed: an expire that failed can be called again.
            self._machine.run(
                expire_critical_reader,
                ExpireCriticalReader(self.reader_id),
                on_uncertain=rerun_as_is,
            )
            self._expired = True

    def close(self) -> None:
        """Make this handle unusable, leaving the hold in place: a critical since is durable
        by design (it outlives processes, guarded by its opaque token), so only
        :meth:`expire` releases it. Idempotent."""
        self._closed = True

    def _check_live(self) -> None:
        if self._closed:
            raise ClosedError(f"critical since {self.reader_id} of {self.shard_id!r} was closed")
        if self._expired:
            raise ClosedError(f"critical since {self.reader_id} of {self.shard_id!r} was expired")
