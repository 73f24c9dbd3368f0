"""The shard state and its pure transitions: records, diffs and rollups, the spine and the GC
rules. Nothing here does I/O."""
