"""A decoder of PostgreSQL's ``pgoutput`` logical replication messages, protocol version 1
(the PostgreSQL manual, "Logical Replication Message Formats"). Pure: bytes in, records out.

Only what the source needs is decoded: Begin, Commit, Relation, Insert, Update, Delete and
Truncate; Origin, Type and logical Messages are skipped. Column values arrive in the text
output format (the same text ``SELECT col::text`` gives), ``None`` for NULL, and
:data:`UNCHANGED` for an unchanged TOASTed value in an update's new row.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">bQQq")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_COLUMN = struct.Struct(">bxxxx")  # flags; the type oid and modifier are read apart


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = _Unchanged()
"""An unchanged TOASTed column of an update's new row (the old row has its value)."""

Value = str | None | _Unchanged
TupleData = list[Value]


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    end_lsn: int


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]

    @property
    def qualified(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class Insert:
    oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    oid: int
    old: TupleData | None  # None: the replica identity sent no old row
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    oid: int
    old: TupleData
    key_only: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    oids: tuple[int, ...]


Message = Begin | Commit | Relation | Insert | Update | Delete | Truncate | None


def _cstring(data: bytes, at: int) -> tuple[str, int]:
    end = data.index(b"\0", at)
    return data[at:end].decode(), end + 1


def _tuple(data: bytes, at: int) -> tuple[TupleData, int]:
    (n,) = _U16.unpack_from(data, at)
    at += 2
    values: TupleData = []
    for _ in range(n):
        kind = data[at : at + 1]
        at += 1
        if kind == b"n":
            values.append(None)
        elif kind == b"u":
            values.append(UNCHANGED)
        elif kind in (b"t", b"b"):
            (length,) = _U32.unpack_from(data, at)
            at += 4
            values.append(data[at : at + length].decode())
            at += length
        else:
            raise ValueError(f"pgoutput: unknown tuple column kind {kind!r}")
    return values, at


def decode(data: bytes) -> Message:
    """One message (``None`` for the kinds the source ignores)."""
    kind = data[:1]
    if kind == b"B":
        final_lsn, _ts, xid = _BEGIN.unpack_from(data, 1)
        return Begin(final_lsn, xid)
    if kind == b"C":
        _flags, commit_lsn, end_lsn, _ts = _COMMIT.unpack_from(data, 1)
        return Commit(commit_lsn, end_lsn)
    if kind == b"R":
        (oid,) = _U32.unpack_from(data, 1)
        namespace, at = _cstring(data, 5)
        name, at = _cstring(data, at)
        identity = chr(data[at])
        (n,) = _U16.unpack_from(data, at + 1)
        at += 3
        columns = []
        for _ in range(n):
            flags = data[at]
            column, at = _cstring(data, at + 1)
            (type_oid,) = _U32.unpack_from(data, at)
            at += 8  # type oid and type modifier
            columns.append(Column(column, type_oid, bool(flags & 1)))
        return Relation(oid, namespace or "pg_catalog", name, identity, tuple(columns))
    if kind == b"I":
        (oid,) = _U32.unpack_from(data, 1)
        new, _ = _tuple(data, 6)  # after the 'N'
        return Insert(oid, new)
    if kind == b"U":
        (oid,) = _U32.unpack_from(data, 1)
        at = 5
        old: TupleData | None = None
        if data[at : at + 1] in (b"K", b"O"):
            old, at = _tuple(data, at + 1)
        new, _ = _tuple(data, at + 1)
        return Update(oid, old, new)
    if kind == b"D":
        (oid,) = _U32.unpack_from(data, 1)
        key_only = data[5:6] == b"K"
        old, _ = _tuple(data, 6)
        return Delete(oid, old, key_only)
    if kind == b"T":
        (n,) = _U32.unpack_from(data, 1)
        return Truncate(tuple(_U32.unpack_from(data, 6 + 4 * i)[0] for i in range(n)))
    return None
