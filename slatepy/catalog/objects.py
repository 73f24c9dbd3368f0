"""The catalog's collections at the current schema version (RFC 0028 §2).

Every collection is a map from a key Struct to a value Struct (msgspec), stored as their JSON
(the key's JSON is canonical: the Struct's field order, so equal keys are equal bytes). Older
versions' types are frozen in :mod:`slatepy.catalog.upgrade`; these are the newest, version
:data:`CATALOG_VERSION`. Connection strings never hold secrets: every field that holds one is
stored with its password removed (:func:`strip_password`, in the Structs' ``__post_init__``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import msgspec

from slatepy.catalog.errors import InvalidCatalogObject

CATALOG_VERSION = 2
"""The schema version this code writes (config ``catalog_version``)."""

MAX_KEY_BYTES = 4_096
MAX_OBJECT_BYTES = 60_000
"""The largest key JSON, and key plus value JSON, of one object in every implementation:
persist stores an object as one update whose encoding (collection name and framing
included) is at most 65,535 bytes (its SST key lengths are u16), and the object's audit
event repeats its key; the SQL stash is held to the same, so that a catalog fits either."""
MAX_USER_BYTES = 1_024
"""The largest user name an audit event records (see :data:`MAX_OBJECT_BYTES`)."""

_SECRET_WORDS = ("password", "passwd", "secret", "token", "credential", "apikey", "api_key")
_SECRET_NAMES = frozenset({"sig", "signature", "x-amz-signature"})  # signed URLs (SAS, S3)


def is_secret(name: str) -> bool:
    """Whether a query parameter or option called ``name`` holds a secret."""
    lower = name.lower()
    return lower in _SECRET_NAMES or any(word in lower for word in _SECRET_WORDS)


_USERINFO_SECRET = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@]*):[^@]*@")
_CONNINFO_SECRET = re.compile(
    r"(?i)(?:^|\s)(?:password|passwd|secret|sslpassword)\s*=\s*(?:'(?:[^'\\]|\\.)*'|\S*)"
)


def strip_password(url: str) -> str:
    """``url`` without a password in its user info or secrets in its query (``password=``,
    ``sas_token=``, ``sig=``: :func:`is_secret`), or a
    libpq ``key=value`` connection string without its ``password=...``; other strings (a
    path, a name) come back unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:  # unparsable (``postgresql://[::1``): drop ``:password@`` textually
        return _USERINFO_SECRET.sub(r"\1@", url)
    if not parts.scheme or not parts.netloc:
        return _CONNINFO_SECRET.sub("", url).strip() if "=" in url else url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, v) for k, v in pairs if not is_secret(k)])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def strip_options(options: dict[str, str]) -> dict[str, str]:
    """``options`` without secret-named ones (:func:`is_secret`), the rest's values through
    :func:`strip_password`."""
    return {k: strip_password(v) for k, v in options.items() if not is_secret(k)}


def redact(obj: Any) -> Any:
    """``obj`` (JSON-able) with :func:`strip_password` applied to every string in it: what
    the dump and the debug tool print, so that a password stored before version 2 (or by
    anything else) is never shown."""
    if isinstance(obj, str):
        return strip_password(obj)
    if isinstance(obj, dict):
        return {k: redact(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj


class _Object(msgspec.Struct, forbid_unknown_fields=True):
    """A catalog key or value: unknown fields are refused, so a typo never round-trips."""


class IdKey(_Object):
    id: int


class NameKey(_Object):
    name: str


class ConfigKey(_Object):
    key: str


class ShardKey(_Object):
    """A persist shard where it lives: a location URL (no password) and its shard id."""

    location: str
    shard: str

    def __post_init__(self) -> None:
        self.location = strip_password(self.location)


class Database(_Object):
    """A slatepy KV database (``url``: its store location, no password)."""

    name: str
    url: str
    owner: str = ""

    def __post_init__(self) -> None:
        self.url = strip_password(self.url)


class Shard(_Object):
    """What a persist shard is for: ``purpose`` ``data``, ``remap``, ``sink`` or ``other``;
    ``owner`` the source or sink name that writes it."""

    purpose: str
    owner: str = ""


class Source(_Object):
    """An upstream feeding a data shard through a remap shard (connection: no password)."""

    name: str
    kind: str
    connection: str = ""
    location: str = ""
    data_shard: str = ""
    remap_shard: str = ""
    options: dict[str, str] = {}

    def __post_init__(self) -> None:
        self.connection = strip_password(self.connection)
        self.location = strip_password(self.location)
        self.options = strip_options(self.options)


class Sink(_Object):
    """A writer of a slatepy target (a persist shard, a KV database) from a pipeline."""

    name: str
    kind: str
    target: str
    options: dict[str, str] = {}

    def __post_init__(self) -> None:
        self.target = strip_password(self.target)
        self.options = strip_options(self.options)


class IdAllocator(_Object):
    next_id: int


class ConfigValue(_Object):
    value: int


class StringValue(_Object):
    value: str


class AuditEvent(_Object):
    """One committed change: ``event_type`` ``create``, ``update``, ``delete``, or
    ``initialize``/``migrate`` for the catalog itself."""

    event_type: str
    collection: str
    key: dict[str, Any]
    user: str
    occurred_at_ms: int


class StorageUsage(_Object):
    shard: str
    location: str
    bytes: int
    collected_at_ms: int

    def __post_init__(self) -> None:
        self.location = strip_password(self.location)


@dataclass(frozen=True, slots=True)
class Collection:
    """One collection: its types and rules.

    Attributes:
        cached: Held in memory by an open catalog (``audit_log`` and ``storage_usage`` are
            not: they are only appended to, and read from storage when asked for).
        append_only: Only typed transaction methods append to it; nothing is changed or
            deleted (the generic ``set``/``delete`` refuse it).
        unique: The part of a value that must be unique in the collection (None: no rule).
    """

    name: str
    key: type[_Object]
    value: type[_Object]
    cached: bool = True
    append_only: bool = False
    unique: Callable[[Any], object] | None = None

    def decode_key(self, data: bytes) -> Any:
        return msgspec.json.decode(data, type=self.key)

    def decode_value(self, data: bytes) -> Any:
        return msgspec.json.decode(data, type=self.value)

    def key_bytes(self, key: Any) -> bytes:
        """The canonical JSON of ``key`` (a Struct of this collection or a JSON-able dict)."""
        return self._encode(self._convert(key, self.key, "key"), "key")

    def value_bytes(self, value: Any) -> bytes:
        return self._encode(self._convert(value, self.value, "value"), "value")

    def check_size(self, key: bytes, value: bytes) -> None:
        """Raise unless the object fits every implementation (:data:`MAX_OBJECT_BYTES`).

        Raises:
            InvalidCatalogObject: naming the object (its key, shortened).
        """
        shown = key[:100].decode(errors="replace") + ("..." if len(key) > 100 else "")
        if len(key) > MAX_KEY_BYTES:
            raise InvalidCatalogObject(
                f"{self.name} {shown}: the key is too large ({len(key)} bytes of JSON; at "
                f"most {MAX_KEY_BYTES})"
            )
        if len(key) + len(value) > MAX_OBJECT_BYTES:
            raise InvalidCatalogObject(
                f"{self.name} {shown}: the object is too large ({len(key) + len(value)} bytes "
                f"of JSON; key and value at most {MAX_OBJECT_BYTES} together)"
            )

    def _encode(self, obj: _Object, what: str) -> bytes:
        try:
            return msgspec.json.encode(obj)
        except UnicodeEncodeError as exc:  # a lone surrogate: JSON input (``\ud800``) has them
            raise InvalidCatalogObject(
                f"the {what} does not fit collection {self.name!r}: a string is not valid "
                f"UTF-8 ({exc.reason} at position {exc.start})"
            ) from None

    def _convert(self, obj: Any, kind: type[_Object], what: str) -> _Object:
        if isinstance(obj, kind):
            return msgspec.convert(msgspec.to_builtins(obj), kind)  # re-runs __post_init__
        try:
            return msgspec.convert(obj, kind)
        except msgspec.ValidationError as exc:
            # The message names the field, never the value: it may hold a password.
            raise InvalidCatalogObject(
                f"the {what} does not fit collection {self.name!r} ({kind.__name__}): {exc}"
            ) from None


def _name(value: Any) -> object:
    return value.name


COLLECTIONS: dict[str, Collection] = {
    c.name: c
    for c in (
        Collection("databases", IdKey, Database, unique=_name),
        Collection("shards", ShardKey, Shard),
        Collection("sources", IdKey, Source, unique=_name),
        Collection("sinks", IdKey, Sink, unique=_name),
        Collection("id_allocators", NameKey, IdAllocator),
        Collection("config", ConfigKey, ConfigValue),
        Collection("settings", NameKey, StringValue),
        Collection("system_configurations", NameKey, StringValue),
        Collection("audit_log", IdKey, AuditEvent, cached=False, append_only=True),
        Collection("storage_usage", IdKey, StorageUsage, cached=False, append_only=True),
    )
}
"""Every collection by name, in dump order."""

LARGE_COLLECTIONS = frozenset({"audit_log", "storage_usage"})
"""Skipped by ``dump --ignore-large-collections``."""

ID_KINDS = ("database", "source", "sink", "audit_log", "storage_usage")
"""The id allocators a new catalog starts with (next id 1 each)."""


def collection(name: str) -> Collection:
    """The collection called ``name``.

    Raises:
        InvalidCatalogObject: no such collection.
    """
    found = COLLECTIONS.get(name)
    if found is None:
        raise InvalidCatalogObject(
            f"unknown catalog collection {name!r}; the collections are {', '.join(COLLECTIONS)}"
        )
    return found


Objects = dict[str, dict[bytes, bytes]]
"""The raw content of a catalog: collection -> canonical key JSON -> value JSON."""


def initial_objects(deploy_generation: int = 0) -> Objects:
    """What a new catalog holds at :data:`CATALOG_VERSION`."""
    enc = msgspec.json.encode
    return {
        "config": {
            enc(ConfigKey("catalog_version")): enc(ConfigValue(CATALOG_VERSION)),
            enc(ConfigKey("deploy_generation")): enc(ConfigValue(deploy_generation)),
        },
        "id_allocators": {enc(NameKey(kind)): enc(IdAllocator(1)) for kind in ID_KINDS},
    }
