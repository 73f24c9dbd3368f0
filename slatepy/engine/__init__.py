"""The engine: memtable, WAL writer with group commit, writer start-up and the Db API."""

from slatepy.engine.batch import WriteBatch
from slatepy.engine.db import Db

__all__ = ["Db", "WriteBatch"]
