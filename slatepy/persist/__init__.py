"""Persist shards: durable, definite time-varying collections of ``((key, value), time, diff)``
updates with ``upper``/``since`` frontiers, shared by writers and readers through the object
store (issue 13; design in ``docs/rfcs/0015-persist-shards.md``).

Layering: ``persist`` builds on ``table``, ``format``, ``store``, ``errors`` and ``config``,
never on the KV ``engine``, ``compactor``, ``gc`` or ``manifest``.
"""
