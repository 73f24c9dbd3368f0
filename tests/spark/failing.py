"""Data sources whose ``commit`` fails *after* it published (tests only; RFC 0025).

Each is the production source with its writer's ``commit`` wrapped: the real commit runs
(the manifest publish or the shard append lands), then, by the ``fault`` option, the commit
raises (``raise``) or its Python worker SIGKILLs itself (``kill``); with ``fault=killgroup``
it SIGKILLs its session's process group (a driver started with ``start_new_session``: the
driver, its JVM and workers) and its own, the crash-inside-commit test. Spark then calls
``abort`` with the same messages. ``once=<marker path>`` fails only the first commit that
gets there (it creates the marker).

:func:`register` registers them by value, so Spark's workers need not import ``tests``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from slatepy.spark.kv import KvDataSource, KvWriter
from slatepy.spark.persist_sink import (
    PersistBatchWriter,
    PersistDataSource,
    PersistStreamWriter,
    sink_config,
)

FAULTS = ("raise", "kill", "killgroup")


class CommitFailed(RuntimeError):
    """The injected failure after a commit landed."""


def _split(options: Mapping[str, str]) -> tuple[dict[str, str], str, str | None]:
    rest = {k: v for k, v in options.items() if k.lower() not in ("fault", "once")}
    lowered = {k.lower(): v for k, v in options.items()}
    fault = lowered.get("fault", "raise")
    assert fault in FAULTS, fault
    return rest, fault, lowered.get("once")


def fail(fault: str, once: str | None) -> None:
    """Inject ``fault`` (after the real commit)."""
    if once is not None:
        if os.path.exists(once):
            return
        with open(once, "w") as out:
            out.write(str(os.getpid()))
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "killgroup":
        # PySpark's worker daemon runs in a process group of its own; the driver (a session
        # leader) and its JVM are in the session's group: kill that first.
        os.killpg(os.getsid(0), signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    raise CommitFailed("injected: the commit failed after it published")


class FailingKvWriter(KvWriter):
    fault = "raise"
    once: str | None = None

    def commit(self, messages: Any) -> None:
        super().commit(messages)
        fail(self.fault, self.once)


class FailingKv(KvDataSource):
    @classmethod
    def name(cls) -> str:
        return "failing.slatepy"

    def writer(self, schema: Any, overwrite: bool) -> KvWriter:
        options, fault, once = _split(self.options)
        writer = FailingKvWriter(options, schema, overwrite=overwrite)
        writer.fault, writer.once = fault, once
        return writer


class FailingPersistBatchWriter(PersistBatchWriter):
    fault = "raise"
    once: str | None = None

    def commit(self, messages: Any) -> None:
        super().commit(messages)
        fail(self.fault, self.once)


class FailingPersistStreamWriter(PersistStreamWriter):
    fault = "raise"
    once: str | None = None

    def commit(self, messages: Any, batchId: int) -> None:
        super().commit(messages, batchId)
        fail(self.fault, self.once)


class FailingPersist(PersistDataSource):
    @classmethod
    def name(cls) -> str:
        return "failing.slatepy.persist"

    def writer(self, schema: Any, overwrite: bool) -> PersistBatchWriter:
        options, fault, once = _split(self.options)
        writer = FailingPersistBatchWriter(sink_config(options, schema, stream=False))
        writer.fault, writer.once = fault, once
        return writer

    def streamWriter(self, schema: Any, overwrite: bool) -> PersistStreamWriter:
        options, fault, once = _split(self.options)
        writer = FailingPersistStreamWriter(sink_config(options, schema, stream=True))
        writer.fault, writer.once = fault, once
        return writer


def register(spark: Any) -> None:
    """Register both failing sources on ``spark`` (by value: workers need not import us)."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(FailingKv)
    spark.dataSource.register(FailingPersist)
