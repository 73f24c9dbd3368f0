"""The table layout a bulk load records beside the manifest (RFC 0025, "Tables").

``spark/table.json`` at the database's root: the row schema of the last load and how it
maps to keys and values, so that ``spark.read.format("slatepy").option("url", URL).load()``
returns the loaded columns with their types and no ``.schema(...)``::

    {"format": 1,
     "columns": [{"name": "id", "type": "long", "nullable": false}, ...],
     "key": ["id"], "value": null}

``type`` is Spark's type name (``DataType.typeName()``), ``key`` the key columns in order,
``value`` the raw binary value column (null: the non-key columns as a msgpack map). GC and
the engine never look at it (GC only lists ``wal/``, ``compacted/`` and ``manifest/``); a
clone does not copy it. A load whose layout conflicts with the recorded one (other key
columns, another type for a column both have, another ``value``) is refused before any task
runs; a read's explicit schema wins over the recorded one unless it conflicts the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from slatepy.errors import InvalidArgument, NotFound
from slatepy.spark.codec import Column
from slatepy.store.base import ObjectStore

TABLE_PATH = "spark/table.json"
FORMAT = 1

_DDL_TYPES = {"integer": "int", "byte": "tinyint", "short": "smallint", "long": "bigint"}


@dataclass(frozen=True, slots=True)
class TableLayout:
    """A recorded row layout: columns, key columns, the raw value column (or None)."""

    columns: tuple[Column, ...]
    key: tuple[str, ...]
    value: str | None

    def ddl(self) -> str:
        """The schema as a Spark DDL string (nullability included)."""
        return ", ".join(
            f"`{c.name}` {_DDL_TYPES.get(c.type_name, c.type_name)}"
            + ("" if c.nullable else " NOT NULL")
            for c in self.columns
        )

    def describe(self) -> str:
        """``key (id long), value columns (name string, ...)`` for error messages."""
        types = {c.name: c.type_name for c in self.columns}
        keys = ", ".join(f"{k} {types[k]}" for k in self.key)
        rest = [c for c in self.columns if c.name not in self.key]
        values = (
            f"raw value column {self.value}"
            if self.value
            else "value columns (" + ", ".join(f"{c.name} {c.type_name}" for c in rest) + ")"
        )
        return f"key ({keys}), {values}"

    def encode(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT,
                "columns": [
                    {"name": c.name, "type": c.type_name, "nullable": c.nullable}
                    for c in self.columns
                ],
                "key": list(self.key),
                "value": self.value,
            },
            indent=1,
        ).encode()

    @staticmethod
    def decode(data: bytes) -> TableLayout:
        doc = json.loads(data)
        if doc.get("format") != FORMAT:
            raise InvalidArgument(f"{TABLE_PATH}: unknown format {doc.get('format')!r}")
        columns = tuple(Column(c["name"], c["type"], bool(c["nullable"])) for c in doc["columns"])
        return TableLayout(columns, tuple(doc["key"]), doc.get("value"))

    def check(self, columns: Sequence[Column], key: Sequence[str], value: str | None) -> None:
        """Refuse a layout that reads or writes the stored rows differently.

        Raises:
            InvalidArgument: naming the column or option and this recorded layout.
        """
        where = f"the database's recorded layout ({TABLE_PATH}) is {self.describe()}"
        if tuple(key) != self.key:
            raise InvalidArgument(f"option 'key': columns {list(key)}, but {where}")
        if value != self.value:
            raise InvalidArgument(f"option 'value': {value!r}, but {where}")
        recorded = {c.name: c.type_name for c in self.columns}
        for column in columns:
            stored = recorded.get(column.name)
            if stored is not None and stored != column.type_name:
                raise InvalidArgument(f"column {column.name!r} is {column.type_name}, but {where}")


def read_layout(store: ObjectStore) -> TableLayout | None:
    """The recorded layout, or None when no load recorded one."""
    try:
        return TableLayout.decode(store.get(TABLE_PATH))
    except NotFound:
        return None


def write_layout(store: ObjectStore, layout: TableLayout) -> None:
    """Record ``layout`` (overwriting: a compatible load may add value columns)."""
    store.put(TABLE_PATH, layout.encode())
