"""``slatepy wal tail``: a database's committed writes, one line each (change data capture)."""

from __future__ import annotations

import argparse
from typing import Any

from slatepy.cli.output import escape, print_json
from slatepy.config import Settings
from slatepy.engine.wal_reader import StartAt, WalReader, WalRecord
from slatepy.store.base import ObjectStore


def parse_start(text: str) -> StartAt:
    """``--from-seq`` (an argparse type): a seq >= 0, ``oldest`` or ``end``."""
    if text in ("oldest", "end"):
        return text  # type: ignore[return-value]
    try:
        seq = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a seq, 'oldest' or 'end', not {text!r}") from None
    if seq < 0:
        raise argparse.ArgumentTypeError(f"{seq} is less than 0")
    return seq


def describe(record: WalRecord) -> str:
    """One record as a line of tab-separated ``name=value`` fields (after the kind): seq, WAL
    SST, kind, and keys and values escaped as ``scan`` prints them (``output.escape``: no
    line breaks, tabs or terminal escapes inside a field). A merge has an ``operand=`` field
    per operand, oldest first; a TTL put adds ``expire_at_ms=``."""
    fields = [f"seq={record.seq}", f"wal={record.wal_id}", record.kind]
    if record.kind == "delete":
        fields.append(f"key={escape(record.key)}")
    elif record.kind == "merge":
        fields.append(f"key={escape(record.key)}")
        fields += [f"operand={escape(op)}" for op in record.operands]
    elif record.kind == "delete_range":
        fields += [f"start={escape(record.key)}", f"end={escape(record.end or b'')}"]
    else:
        fields += [f"key={escape(record.key)}", f"value={escape(record.value or b'')}"]
        if record.expire_at_ms is not None:
            fields.append(f"expire_at_ms={record.expire_at_ms}")
    return "\t".join(fields)


def as_json(record: WalRecord) -> dict[str, Any]:
    """One record for ``--json`` (one object per line), bytes escaped as in ``describe``."""
    out: dict[str, Any] = {"seq": record.seq, "wal": record.wal_id, "kind": record.kind}
    if record.kind == "delete_range":
        out |= {"start": escape(record.key), "end": escape(record.end or b"")}
        return out
    out["key"] = escape(record.key)
    if record.kind == "merge":
        out["operands"] = [escape(op) for op in record.operands]
    elif record.kind == "put":
        out["value"] = escape(record.value or b"")
        out["expire_at_ms"] = record.expire_at_ms
    return out


def tail(
    store: ObjectStore, settings: Settings, start: StartAt, *, follow: bool, json: bool = False
) -> None:
    """Print the writes from ``start`` on; with ``follow``, until interrupted."""
    with WalReader(store, settings=settings) as reader:
        for record in reader.iter(start, follow=follow):
            if json:
                print_json(as_json(record), lines=True)
            else:
                print(describe(record), flush=follow)
