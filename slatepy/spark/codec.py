"""Rows <-> (key, value) bytes: the one mapping the KV sources read and write with.

The mapping is fixed by two options and the row schema (RFC 0016, "Row codec"):

* ``key``: comma-separated key columns (string, binary or an integer type), encoded so that
  byte order is the order of the key tuples:

  - an integer column (byte, short, int, long): 8 bytes big-endian, sign bit flipped
    (``v + 2**63``), whatever its width;
  - a string column: its UTF-8 bytes; a binary column: its bytes;
  - in a composite key every string or binary column but the last is made self-delimiting:
    each ``00`` byte becomes ``00 FF`` and ``00 01`` ends it (an ended value sorts before
    every longer one). The last column is written as is, so a single string or binary key
    is just its bytes, what ``Db.get`` callers would use.

* ``value``: the one binary column that is the value, stored as is (then there must be no
  other non-key column). Without it, the non-key columns (string, binary, integers, float,
  double, boolean; nulls allowed) are a msgpack map ``{column: value}``.

Key columns may not be null; a null there, or in the ``value`` column, is an error naming
the option. Everything here is plain Python over column lists and ``pyarrow``; no Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow as pa

from slatepy.errors import InvalidArgument

INT_TYPES: dict[str, tuple[int, pa.DataType]] = {
    "byte": (8, pa.int8()),
    "short": (16, pa.int16()),
    "integer": (32, pa.int32()),
    "long": (64, pa.int64()),
}
"""Spark integer type names -> (bits, Arrow type)."""

VALUE_TYPES: dict[str, tuple[type, pa.DataType]] = {
    "string": (str, pa.string()),
    "binary": (bytes, pa.binary()),
    "double": (float, pa.float64()),
    "float": (float, pa.float32()),
    "boolean": (bool, pa.bool_()),
    **{name: (int, arrow) for name, (_, arrow) in INT_TYPES.items()},
}
"""Spark type names (``DataType.typeName()``) a column may have -> (Python, Arrow) types."""

KEY_TYPES = frozenset({"string", "binary", *INT_TYPES})

_SIGN = 1 << 63
_END = b"\x00\x01"


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the row schema: name, Spark type name, nullability."""

    name: str
    type_name: str
    nullable: bool = True


@dataclass(frozen=True, slots=True)
class RowCodec:
    """Encodes rows of ``columns`` to (key, value) bytes and decodes them back.

    Build with :meth:`of`, which validates. Picklable (it travels to Spark tasks).
    """

    columns: tuple[Column, ...]
    key: tuple[int, ...]
    value: int | None  # the binary value column, or None: the rest as a msgpack map
    rest: tuple[int, ...]

    @classmethod
    def of(cls, columns: Sequence[Column], key: Sequence[str], value: str | None) -> RowCodec:
        """Validate the mapping of ``columns`` by the ``key`` and ``value`` options.

        Raises:
            InvalidArgument: naming the option (``key`` or ``value``) that cannot apply.
        """
        names = [c.name for c in columns]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"the schema has duplicate column names: {names}")
        if not key:
            raise InvalidArgument("option 'key' is required: the key column(s), comma-separated")
        index = {n: i for i, n in enumerate(names)}
        key_idx: list[int] = []
        for name in key:
            if name not in index:
                raise InvalidArgument(f"option 'key': no column {name!r} in the schema {names}")
            if index[name] in key_idx:
                raise InvalidArgument(f"option 'key': column {name!r} is named twice")
            col = columns[index[name]]
            if col.type_name not in KEY_TYPES:
                raise InvalidArgument(
                    f"option 'key': column {name!r} is of type {col.type_name}; key columns "
                    f"must be string, binary or an integer type"
                )
            key_idx.append(index[name])
        others = [i for i in range(len(columns)) if i not in key_idx]
        value_idx: int | None = None
        if value is not None:
            if value not in index:
                raise InvalidArgument(f"option 'value': no column {value!r} in the schema {names}")
            value_idx = index[value]
            if value_idx in key_idx:
                raise InvalidArgument(f"option 'value': column {value!r} is a key column")
            if columns[value_idx].type_name != "binary":
                raise InvalidArgument(
                    f"option 'value': column {value!r} is of type "
                    f"{columns[value_idx].type_name}; the value column must be binary (or "
                    f"leave 'value' out to store the non-key columns as msgpack)"
                )
            extra = [names[i] for i in others if i != value_idx]
            if extra:
                raise InvalidArgument(
                    f"option 'value': with a value column, the schema may hold only key "
                    f"columns and it; {extra} would not be stored"
                )
            others = []
        for i in others:
            if columns[i].type_name not in VALUE_TYPES:
                raise InvalidArgument(
                    f"option 'value' not set, so column {names[i]!r} goes into the msgpack "
                    f"value, but its type {columns[i].type_name} cannot be encoded (supported: "
                    f"{', '.join(sorted(VALUE_TYPES))})"
                )
        return cls(tuple(columns), tuple(key_idx), value_idx, tuple(others))

    # -- keys --------------------------------------------------------------------------

    def _key_column(self, position: int) -> Column:
        return self.columns[self.key[position]]

    def encode_bound(self, text: str, option: str, *, prefix: bool = False) -> bytes:
        """The encoded key bytes a range option gives, as a value of the first key column.

        ``start``/``end``: every key whose first column is >= (resp. <) the value. For a
        composite key the value is encoded without its end marker, which sorts it before
        every key that begins with it. ``prefix`` applies to string/binary columns only.
        Binary columns take the option's UTF-8 bytes.
        """
        col = self._key_column(0)
        if col.type_name in INT_TYPES:
            if prefix:
                raise InvalidArgument(
                    f"option '{option}': the first key column {col.name!r} is an integer; "
                    f"a prefix applies to string or binary keys (use 'start'/'end')"
                )
            try:
                number = int(text)
            except ValueError:
                raise InvalidArgument(
                    f"option '{option}': {text!r} is not an integer (key column {col.name!r})"
                ) from None
            return _encode_int(number, col, option)
        raw = text.encode()
        return raw.replace(b"\x00", b"\x00\xff") if len(self.key) > 1 else raw

    def encode_keys(self, key_columns: Sequence[Sequence[Any]]) -> list[bytes]:
        """The encoded keys of rows given column-wise (one list per key column).

        Raises:
            InvalidArgument: a key value is null (naming option ``key``) or out of range.
        """
        last = len(self.key) - 1
        parts: list[list[bytes]] = []
        for position, values in enumerate(key_columns):
            col = self._key_column(position)
            if any(v is None for v in values):
                raise InvalidArgument(
                    f"option 'key': key column {col.name!r} holds a null; every key column "
                    f"must be set in every row"
                )
            if col.type_name in INT_TYPES:
                parts.append([_encode_int(v, col, "key") for v in values])
            elif col.type_name == "string":
                encoded = [v.encode() for v in values]
                parts.append(encoded if position == last else [_delimit(b) for b in encoded])
            else:
                raw = [bytes(v) for v in values]
                parts.append(raw if position == last else [_delimit(b) for b in raw])
        if len(parts) == 1:
            return parts[0]
        return [b"".join(p) for p in zip(*parts, strict=True)]

    def decode_keys(self, keys: Sequence[bytes]) -> list[list[Any]]:
        """Key columns (one list per key column) of encoded ``keys``."""
        if len(self.key) == 1:
            return [[self._decode_part(0, k) for k in keys]]
        out: list[list[Any]] = [[] for _ in self.key]
        last = len(self.key) - 1
        for k in keys:
            pos = 0
            for position in range(len(self.key)):
                col = self._key_column(position)
                if col.type_name in INT_TYPES:
                    out[position].append(_decode_int(k[pos : pos + 8]))
                    pos += 8
                elif position == last:
                    out[position].append(self._decode_part(position, k[pos:]))
                else:
                    raw, pos = _undelimit(k, pos)
                    out[position].append(raw.decode() if col.type_name == "string" else raw)
        return out

    def _decode_part(self, position: int, data: bytes) -> Any:
        kind = self._key_column(position).type_name
        if kind in INT_TYPES:
            return _decode_int(data)
        return data.decode() if kind == "string" else data

    # -- values ------------------------------------------------------------------------

    def encode_values(self, columns: Mapping[int, Sequence[Any]], rows: int) -> list[bytes]:
        """Encoded values of ``rows`` rows; ``columns`` maps column index -> its values.

        Raises:
            InvalidArgument: the value column holds a null (naming option ``value``).
        """
        if self.value is not None:
            values = columns[self.value]
            if any(v is None for v in values):
                raise InvalidArgument(
                    f"option 'value': column {self.columns[self.value].name!r} holds a null; "
                    f"a stored value cannot be null"
                )
            return [bytes(v) for v in values]
        names = [self.columns[i].name for i in self.rest]
        cols = [columns[i] for i in self.rest]
        encode = msgspec.msgpack.Encoder().encode
        if not cols:
            return [encode({})] * rows
        return [encode(dict(zip(names, row, strict=True))) for row in zip(*cols, strict=True)]

    def decode_values(self, values: Sequence[bytes]) -> dict[int, list[Any]]:
        """Column index -> values, for the non-key columns of stored ``values``."""
        if self.value is not None:
            return {self.value: list(values)}
        if not self.rest:
            return {}
        fields = [
            (self.columns[i].name, VALUE_TYPES[self.columns[i].type_name][0] | None, None)
            for i in self.rest
        ]
        struct = msgspec.defstruct("Value", fields)
        decoder = msgspec.msgpack.Decoder(struct)
        names = [self.columns[i].name for i in self.rest]
        out: dict[int, list[Any]] = {i: [] for i in self.rest}
        lists = [out[i] for i in self.rest]
        try:
            for data in values:
                decoded = decoder.decode(data)
                for name, column in zip(names, lists, strict=True):
                    column.append(getattr(decoded, name))
        except msgspec.DecodeError as exc:
            raise InvalidArgument(
                f"a stored value does not decode as a msgpack map of the schema's non-key "
                f"columns {names} (set option 'value' for raw binary values): {exc}"
            ) from exc
        return out

    # -- Arrow -------------------------------------------------------------------------

    def arrow_schema(self) -> pa.Schema:
        """The Arrow form of the row schema, nullability included (what Spark checks)."""
        return pa.schema(
            [pa.field(c.name, _arrow_type(c), nullable=c.nullable) for c in self.columns]
        )

    def to_batch(self, pairs: Sequence[tuple[bytes, bytes]], schema: pa.Schema) -> pa.RecordBatch:
        """A record batch of ``schema`` (from :meth:`arrow_schema`) for ``(key, value)``."""
        keys = [k for k, _ in pairs]
        try:
            decoded = self.decode_keys(keys)
        except (UnicodeDecodeError, ValueError, IndexError) as exc:
            layout = ", ".join(
                f"{self._key_column(i).name} {self._key_column(i).type_name}"
                for i in range(len(self.key))
            )
            raise InvalidArgument(
                f"option 'key': a stored key does not decode as key column(s) ({layout}): {exc}"
            ) from exc
        by_index: dict[int, Sequence[Any]] = dict(zip(self.key, decoded, strict=True))
        by_index.update(self.decode_values([v for _, v in pairs]))
        arrays = [
            pa.array(by_index.get(i, [None] * len(pairs)), type=schema.field(i).type)
            for i in range(len(self.columns))
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def from_batch(self, batch: pa.RecordBatch) -> tuple[list[bytes], list[bytes]]:
        """Encoded keys and values of the rows of ``batch`` (columns by position)."""
        key_cols = [batch.column(i).to_pylist() for i in self.key]
        used = self.rest if self.value is None else (self.value,)
        cols = {i: batch.column(i).to_pylist() for i in used}
        return self.encode_keys(key_cols), self.encode_values(cols, batch.num_rows)


def columns_of(fields: Iterable[tuple[str, str, bool]]) -> tuple[Column, ...]:
    """Columns from ``(name, Spark type name, nullable)``."""
    return tuple(Column(n, t, nullable) for n, t, nullable in fields)


def _arrow_type(col: Column) -> pa.DataType:
    if col.type_name not in VALUE_TYPES:
        raise InvalidArgument(f"column {col.name!r}: type {col.type_name} is not supported")
    return VALUE_TYPES[col.type_name][1]


def _encode_int(value: int, col: Column, option: str) -> bytes:
    bits = INT_TYPES[col.type_name][0]
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise InvalidArgument(
            f"option '{option}': {value} is out of range for the {col.type_name} key column "
            f"{col.name!r}"
        )
    return (value + _SIGN).to_bytes(8, "big")


def _decode_int(data: bytes) -> int:
    return int.from_bytes(data, "big") - _SIGN


def _delimit(raw: bytes) -> bytes:
    return raw.replace(b"\x00", b"\x00\xff") + _END


def _undelimit(key: bytes, pos: int) -> tuple[bytes, int]:
    """The delimited part of ``key`` starting at ``pos`` (unescaped) and where the next
    part starts."""
    i = pos
    while True:
        i = key.find(b"\x00", i)
        if i < 0 or i + 1 >= len(key):
            raise InvalidArgument(f"key {key!r} is not of this key layout (no part end)")
        if key[i + 1] == 0xFF:
            i += 2
            continue
        return key[pos:i].replace(b"\x00\xff", b"\x00"), i + 2


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with ``prefix`` (None: no bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])
