"""``CheckpointReader``: the reader ``DbReader.open(url, checkpoint=id)`` returns (RFC 0017).

Fixed at the checkpoint's manifest and WAL prefix, never polling, writing nothing. It lives
above both :mod:`slatepy.engine.reader` and :mod:`slatepy.engine.checkpoint` (the records), and
hands itself to ``DbReader`` on import (``DbReader.at_checkpoint``): the reader opens it without
importing it, so there is no import circle. ``slatepy.engine`` imports this module, so it is
registered whenever ``DbReader`` can be imported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from slatepy.config import Settings
from slatepy.engine.checkpoint import get_checkpoint
from slatepy.engine.reader import DbReader
from slatepy.engine.view import missing_sst
from slatepy.errors import NotFound
from slatepy.manifest.record import Manifest
from slatepy.manifest.store import StoredManifest
from slatepy.store.metrics import MetricsStore
from slatepy.table.merge_operator import MergeOperator
from slatepy.table.visibility import Clock

T = TypeVar("T")


class CheckpointReader(DbReader):
    """A :class:`DbReader` fixed at a checkpoint: the checkpoint's manifest and WAL prefix.

    It never polls and writes nothing (the checkpoint, not a snapshot of its own, protects
    what it reads), so ``refresh`` does nothing. Use ``DbReader.open(url, checkpoint=id)``.
    """

    def __init__(
        self,
        store: MetricsStore,
        settings: Settings,
        checkpoint_id: str,
        *,
        clock: Clock = time.time,
        merge_operator: MergeOperator | None = None,
    ) -> None:
        self.checkpoint = get_checkpoint(store, settings, checkpoint_id)
        super().__init__(
            store, settings, read_only=True, clock=clock, merge_operator=merge_operator
        )

    def _register(self, applied: int | None = None) -> tuple[StoredManifest, int]:
        checkpoint = self.checkpoint
        try:
            manifest = self._manifests.read(checkpoint.manifest_id)
        except NotFound as exc:
            raise NotFound(
                f"checkpoint {checkpoint.id}: its manifest {checkpoint.manifest_id} is gone "
                "(the checkpoint expired or was deleted while opening)",
                path=exc.path,
            ) from exc
        return StoredManifest(checkpoint.manifest_id, manifest), checkpoint.wal_id

    def refresh(self) -> None:
        """Nothing to do: a checkpoint's view never changes."""
        self._check_open()

    def _poll(self, *, thorough: bool) -> bool:
        return False  # the background poll has nothing to look for either

    def _read(self, read: Callable[[Manifest], T], view: Manifest | None = None) -> T:
        """``read`` of the fixed view; a missing SST is damage while the checkpoint lives, and
        the checkpoint's end otherwise (there is no newer view to catch up with)."""
        try:
            return read(self._view if view is None else view)
        except NotFound as exc:
            try:
                get_checkpoint(self._store, self._settings, self.checkpoint.id)
            except NotFound:
                raise NotFound(
                    f"checkpoint {self.checkpoint.id} expired or was deleted, and GC collected "
                    f"what it held ({exc.path}); create a new checkpoint",
                    path=exc.path,
                ) from exc
            raise missing_sst(exc) from exc

    def _run(self) -> None:
        return  # no polling


DbReader.at_checkpoint = CheckpointReader
