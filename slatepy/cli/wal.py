"""``slatepy wal tail``: a database's committed writes, one line each (change data capture)."""

from __future__ import annotations

from slatepy.config import Settings
from slatepy.engine.wal_reader import StartAt, WalReader, WalRecord
from slatepy.errors import InvalidArgument
from slatepy.store.base import ObjectStore


def parse_start(text: str) -> StartAt:
    """``--from-seq``: a seq, ``oldest`` or ``end``."""
    if text in ("oldest", "end"):
        return text  # type: ignore[return-value]
    try:
        seq = int(text)
    except ValueError:
        raise InvalidArgument(f"--from-seq takes a seq, 'oldest' or 'end', not {text!r}") from None
    if seq < 0:
        raise InvalidArgument("--from-seq must be >= 0")
    return seq


def describe(record: WalRecord) -> str:
    """One record as a line: seq, WAL SST, kind, and keys and values as Python bytes literals
    (unambiguous for any bytes: no line breaks, no terminal escapes). Plain puts and deletes
    read as they did before the other kinds existed; a TTL put adds ``expire_at_ms=``."""
    head = f"seq={record.seq} wal={record.wal_id} {record.kind}"
    if record.kind == "delete":
        return f"{head} key={record.key!r}"
    if record.kind == "merge":
        return f"{head} key={record.key!r} operands={list(record.operands)!r}"
    if record.kind == "delete_range":
        return f"{head} start={record.key!r} end={record.end!r}"
    line = f"{head} key={record.key!r} value={record.value!r}"
    return line if record.expire_at_ms is None else f"{line} expire_at_ms={record.expire_at_ms}"


def tail(store: ObjectStore, settings: Settings, from_seq: str, *, follow: bool) -> None:
    """Print the writes from ``from_seq`` on; with ``follow``, until interrupted."""
    start = parse_start(from_seq)
    with WalReader(store, settings=settings) as reader:
        for record in reader.iter(start, follow=follow):
            print(describe(record), flush=follow)
