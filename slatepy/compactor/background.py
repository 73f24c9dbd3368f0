"""Running a compactor on an interval in a thread (in the writer or in ``slatepy compactor``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from slatepy.compactor.compactor import Compactor
from slatepy.errors import FencedError, SlatepyError
from slatepy.manifest.record import Manifest

log = logging.getLogger(__name__)


class BackgroundCompactor:
    """Calls ``compactor.run_until_idle`` every ``interval`` seconds until stopped.

    ``on_publish`` receives each manifest the compactor published (the writer uses it to
    adopt the new view and release memtable memory). Store errors are logged and retried on
    the next pass; being fenced by a newer compactor ends the thread.
    """

    def __init__(
        self,
        compactor: Compactor,
        interval: float,
        on_publish: Callable[[Manifest], None] | None = None,
    ) -> None:
        self.compactor = compactor
        self._interval = interval
        self._on_publish = on_publish
        self._stop = threading.Event()
        self.fenced = False
        self._thread = threading.Thread(target=self._run, name="slatepy-compactor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if self.compactor.run_until_idle(max_rounds=16) and self._on_publish:
                    self._on_publish(self.compactor.last_published.manifest)
            except FencedError:
                log.info("compactor epoch %d was superseded; stopping", self.compactor.epoch)
                self.fenced = True
                return
            except SlatepyError as exc:
                log.warning("compaction pass failed, retrying next interval: %s", exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
