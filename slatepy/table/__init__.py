"""The machinery every LSM user shares: the SST reader over a store with its block and index
caches (``reader``, ``cache``), merge iterators with a pluggable combine (``merge``), and the
object layout (``layout``).

Layering: ``table`` builds on ``format``, ``store``, ``errors`` and ``config`` only; ``engine``,
``compactor``, ``gc`` and ``persist`` build on it, so nothing here knows the KV writer or the
manifest (DESIGN §1, RFC 0015 §12).
"""
