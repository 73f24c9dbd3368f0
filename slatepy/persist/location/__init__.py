"""Where a shard lives: ``Blob`` (the object store stack) and ``Consensus`` (a per-shard
linearizable log of state diffs), with the object-store and PostgreSQL implementations."""
