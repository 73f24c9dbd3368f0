"""The fields of a ``Db``, declared once for the modules that hold its jobs.

``Db`` (:mod:`slatepy.engine.db`) sets them in its constructor; its writes, reads, manifest
adoption and lifecycle are mixins over this class, each in a module of its own, and the few
methods one job calls on another are declared here too, so each mixin type-checks alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from slatepy.config import Settings
from slatepy.engine.embedded import LiveViews
from slatepy.engine.memtable import Memtable
from slatepy.engine.txn import ConflictTracker
from slatepy.engine.wal import WalWriter
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import ManifestStore
from slatepy.store.attach import Attachment
from slatepy.store.metrics import MetricsStore
from slatepy.table.merge_operator import Merging
from slatepy.table.reader import TableReader
from slatepy.table.visibility import Clock

if TYPE_CHECKING:
    from slatepy.compactor import BackgroundCompactor


class DbState:
    """The state every job of a ``Db`` shares (see :meth:`slatepy.engine.db.Db.__init__`)."""

    _store: MetricsStore
    _attachment: Attachment | None
    _settings: Settings
    _clock: Clock
    _merging: Merging
    _lock: threading.Lock
    _views: LiveViews
    _closed: bool
    _refused: bool
    _forked_from: int
    _manifests: ManifestStore
    _tables: TableReader
    _view: Manifest
    _view_time: float
    _stale_view_seconds: float
    _replayed_max_seq: dict[int, int]
    _memtable: Memtable
    _seq: int
    replayed_ssts: int
    _wal: WalWriter
    _txns: ConflictTracker
    _retain_bytes: int
    _wake_bytes: int
    _pruned: threading.Event
    _compactor: BackgroundCompactor | None
    _opened: bool

    if TYPE_CHECKING:  # what one job calls on another (defined by the mixins and ``Db``)

        @property
        def url(self) -> str: ...

        @property
        def epoch(self) -> int: ...

        def refresh(self) -> None: ...

        def flush(self) -> None: ...

        def _check_open(self) -> None: ...

        def _check_readable(self) -> None: ...

        def _refresh_stale_view(self) -> None: ...

        def _wait_for_compaction(self) -> None: ...

        def _apply_manifest(self, manifest: Manifest) -> None: ...

        def _apply(
            self,
            ops: Sequence[tuple[bytes, bytes | None]],
            await_durable: bool,
            *ranges: tuple[bytes, bytes],
            check: Callable[[], None] | None = None,
        ) -> None: ...
