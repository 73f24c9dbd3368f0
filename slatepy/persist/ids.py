"""Identifiers of persist shards and of the things in them (RFC 0015 §4.1, §5.2).

Shard ids and critical reader ids are chosen by callers and become path components and
state keys, so they are held to a path-safe alphabet. Writer ids, leased reader ids,
idempotency tokens and diff nonces are fresh random hex strings drawn per handle or per call.
Blob keys (relative to ``shards/{shard}/``) are built and parsed here too, so that the GC
rules and the writers agree on them.
"""

from __future__ import annotations

import re
import uuid

from slatepy.persist.errors import UsageError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ROLLUP_KEY = re.compile(r"rollup/(\d{20})-[0-9a-f]{32}\.rollup")


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise UsageError(
            f"invalid {what} {value!r}: use 1 to 128 characters of A-Z a-z 0-9 . _ -, "
            "starting with a letter or a digit (it becomes a path component)"
        )
    return value


def validate_shard_id(shard_id: object) -> str:
    """Return ``shard_id`` if it is a valid shard id.

    Raises:
        UsageError: not a string of the path-safe alphabet ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``.
    """
    return _check_name(shard_id, "shard id")


def validate_critical_reader_id(reader_id: object) -> str:
    """Return ``reader_id`` if it is a valid critical reader id (same alphabet as shards).

    Raises:
        UsageError: not a string of the path-safe alphabet.
    """
    return _check_name(reader_id, "critical reader id")


def new_writer_id() -> str:
    """A fresh writer id: ``w`` + 32 hex digits (one per write handle, never reused)."""
    return "w" + uuid.uuid4().hex


def new_leased_reader_id() -> str:
    """A fresh leased reader id: ``r`` + 32 hex digits (one per read handle)."""
    return "r" + uuid.uuid4().hex


def new_token() -> str:
    """A fresh idempotency token (32 hex digits): one per logical ``compare_and_append``."""
    return uuid.uuid4().hex


def new_nonce() -> str:
    """A fresh diff nonce (32 hex digits): makes every attempt's bytes unique (read-back)."""
    return uuid.uuid4().hex


def part_key(writer_id: str, *, compaction: bool = False) -> str:
    """A fresh key for a part written by ``writer_id`` (``c`` marks compaction outputs)."""
    return f"part/{writer_id}/{'c' if compaction else ''}{uuid.uuid4().hex}.sst"


def rollup_key(seqno: int) -> str:
    """A fresh key for a rollup of the state at ``seqno``."""
    return f"rollup/{seqno:020}-{uuid.uuid4().hex}.rollup"


def rollup_seqno(key: str) -> int | None:
    """The seqno a rollup key names, or None when ``key`` is not a rollup key."""
    match = _ROLLUP_KEY.fullmatch(key)
    return int(match.group(1)) if match else None
