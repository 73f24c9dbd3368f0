"""The engine: memtable, WAL writer with group commit, writer start-up, ``Db`` and ``DbReader``."""

from slatepy.engine.batch import WriteBatch
from slatepy.engine.checkpoint_reader import CheckpointReader  # registers with DbReader
from slatepy.engine.db import Db
from slatepy.engine.reader import DbReader

__all__ = ["CheckpointReader", "Db", "DbReader", "WriteBatch"]
