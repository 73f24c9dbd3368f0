"""Settings for a database, a reader or a store.

``Settings`` is a frozen ``msgspec.Struct``: every option has a documented default and is
validated once, when the settings are built, so a bad value fails before anything is written.
Settings come from keyword arguments, a dict, a TOML file or ``SLATEPY_*`` environment
variables (``SLATEPY_FLUSH_INTERVAL=0.05``); :func:`resolve_settings` layers them in the one
precedence every entry point uses (docs/configuration.md).
"""

from __future__ import annotations

import difflib
import functools
import os
import tomllib
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, Self

import msgspec

from slatepy.errors import InvalidArgument, InvalidType

MAX_KEY_SIZE = 65_535
"""Largest key in bytes (the on-disk key length is a u16)."""

MAX_VALUE_SIZE = 16 * 1024 * 1024
"""Largest value in bytes; larger values belong in their own objects."""


class _SettingsMeta(type(msgspec.Struct)):  # type: ignore[misc]
    """Makes ``Settings(flush_intreval=1)`` say "did you mean 'flush_interval'?"."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        fields: tuple[str, ...] = cls.__struct_fields__
        for name in kwargs:
            if name not in fields:
                raise InvalidType(f"unknown setting {name!r}{_did_you_mean(name, fields)}")
        return super().__call__(*args, **kwargs)


SECRETS = frozenset({"s3_secret_access_key", "s3_session_token", "azure_access_key"})
"""Settings a ``repr`` (a log line, a traceback, a notebook) shows only as set or not."""


class Settings(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    metaclass=_SettingsMeta,
):
    """Tunables of a database and of its object store connection.

    Attributes:
        flush_interval: Seconds between WAL flushes of writes not awaited for durability.
        flush_bytes: Buffered WAL bytes that trigger a flush before the interval ends.
        block_size: Target size in bytes of an SST data block. 16 KiB by default, where
            RocksDB and SlateDB use 4 KiB: in Python a block costs about 25 µs to read and
            decode whatever its size, so larger blocks make scans and cold gets cheaper per
            entry (RFC 0006, stop 37 addendum); 4 KiB suits values of a few bytes read at
            random from a dataset much larger than the block cache.
        bloom_bits_per_key: Bloom filter bits per key (10 gives about 1% false positives).
        manifest_update_attempts: Compare-and-swap attempts before a manifest update gives up.
        writer_snapshot_ttl: Seconds the writer's start-up snapshot protects the WAL.
        max_parallel_writes: WAL PUTs a writer keeps in flight at once (stored in the
            manifest; a new writer fences with that many consecutive SSTs).
        max_unflushed_bytes: Memory of written-but-not-yet-compacted data (the writer's
            memtable, Python's per-entry overhead included; RFC 0011) at which writes block
            until compaction catches up. 64 MiB by default, an embedded default that keeps
            a writer's peak RSS under 256 MB whatever it writes (docs/performance.md,
            "Memory": the budgets and what else a writer holds): about 200,000 entries of
            16-byte keys and 100-byte values. One batch is admitted whole, so a batch larger
            than the budget passes it by its own size. Raise it (SlateDB's is 1 GiB) to
            keep more recent writes in memory and ride out longer compaction lags, at that
            memory's price.
        memtable_retain_bytes: Memory of compacted writes the writer keeps in its memtable
            so that reads of recent data stay in memory, as a RocksDB or SlateDB memtable
            serves them until it is flushed; the oldest go first. None (the default) is half
            of ``max_unflushed_bytes``; 0 releases writes as soon as they are compacted. At
            most half of ``max_unflushed_bytes``.
        write_stall_timeout: Seconds a blocked write waits for compaction before it fails
            with ``WriteStalled``.
        wal_write_attempts: Attempts for one WAL SST write after indefinite store failures.
        store_timeout: Seconds one object-store request may take, from connecting to the
            last byte of the response. It also bounds retrying: an idempotent request is not
            attempted again once this long has passed since its first attempt, so a store
            that never answers fails an operation in about this time (one timed-out attempt)
            instead of ``request_attempts`` times it. Raise it for slow links: a compaction
            output of ``target_sst_bytes`` must upload within it.
        store_connect_timeout: Seconds to establish a connection (TCP and TLS) to the store's
            endpoint; an unreachable endpoint fails this fast and is retried.
        store_retries: Retries obstore makes on transient failures of one request.
        request_attempts: Attempts slatepy makes for one idempotent request (read, list,
            delete, copy, overwrite) that still fails after the client's own retries.
        s3_endpoint: S3 endpoint URL (MinIO, moto); ``AWS_ENDPOINT_URL`` when unset.
        s3_region: S3 region; ``AWS_REGION``/``AWS_DEFAULT_REGION`` when unset.
        s3_access_key_id: Access key; ``AWS_ACCESS_KEY_ID`` when unset.
        s3_secret_access_key: Secret key; ``AWS_SECRET_ACCESS_KEY`` when unset.
        s3_session_token: Session token; ``AWS_SESSION_TOKEN`` when unset.
        s3_allow_http: Allow plain-HTTP endpoints; inferred from the endpoint when unset.
        instance_credentials: Let an ``s3://`` or ``gs://`` store without configured
            credentials take them from the cloud's instance metadata server (an EC2 or GCE
            IAM role). Off by default, so that a machine without credentials gets an error
            naming what to set instead of a request to a metadata server that is not there;
            ``AWS_CONTAINER_CREDENTIALS_*`` and ``AWS_WEB_IDENTITY_TOKEN_FILE`` (ECS, EKS)
            and Google's credential variables and files count as configured without it.
        cas: How creates are made exclusive: ``"conditional"`` uses the store's conditional
            writes (S3 ``If-None-Match``, GCS, Azure, MinIO, local files); ``"dynamodb"``
            uses the two-phase write through a DynamoDB table, for S3-compatible stores
            without conditional writes (RFC 0004).
        dynamodb_table: Table of the two-phase records (``slatepy dynamodb create-table``).
        dynamodb_endpoint: DynamoDB endpoint URL (DynamoDB Local, moto); AWS when unset.
        dynamodb_region: DynamoDB region; ``s3_region`` or ``us-east-1`` when unset.
            Credentials are ``s3_access_key_id``/``s3_secret_access_key`` or boto3's chain.
        compactor: ``"in-process"`` (default) runs the compactor and garbage collector in a
            thread of the writer; ``"off"`` leaves both to ``slatepy compactor URL`` (or
            ``slatepy compact``/``slatepy gc``) running elsewhere.
        compaction_interval: Seconds between compaction passes of the compactor while it finds
            work (and at most a pass's length after the writer writes again).
        compaction_max_interval: Ceiling of the compactor's interval while it finds nothing to
            do: each idle pass doubles the interval up to it (a pass that finds nothing costs
            two requests); capped at half of ``compactor_lease`` so a standby never mistakes
            an idle holder for a gone one.
        close_compaction_wait: Seconds ``Db.close()`` lets the in-process compactor finish
            pending compaction (what the close flushed, into L0; L0 into a sorted run once
            it holds two SSTs) before it stops it; a compaction still running after that is
            abandoned (its outputs go to GC). The next open then reads compacted SSTs
            instead of replaying the WAL into memory. 0: abandon at once. A close takes
            along only the sorted runs it can merge in the time left (see
            ``close_merge_rate``), and stops at once an L0 merge already running that
            exceeds that: a merge it would abandon would be redone, in vain, at every
            close.
        close_merge_rate: Bytes of input a second a closing writer's compactor assumes it
            merges: what a close's merge may read is this rate times what is left of
            ``close_compaction_wait`` (32 MiB/s: about half of a merge on a local disk
            with nothing else running; lower it for a slow store or a busy machine).
        compactor_lease: Seconds a compactor that holds the compactor epoch may leave pending
            work untouched before a superseded (standby) compactor takes the epoch back: how
            the writer's in-process compactor resumes after ``slatepy compact`` ended
            (RFC 0013). The holder renews at least every third of it during a long
            compaction; ``slatepy compact`` without ``--force`` refuses while another
            compactor acted within it.
        reader_poll_interval: Seconds between a reader's polls for new WAL SSTs and manifests
            while they find something: an active reader sees a durable write within this
            plus one GET.
        reader_max_poll_interval: Ceiling of a reader's poll interval while idle: each poll
            that finds nothing doubles the interval up to it, the first that finds something
            brings it back to ``reader_poll_interval``. An idle reader costs about two GETs
            per ceiling (no LIST); the first write after an idle spell is seen within it.
        reader_snapshot_ttl: Seconds a reader's snapshot lives unless refreshed; a reader
            refreshes it after a third of that, so a reader that dies stops protecting its
            SSTs from GC within this time.
        gc_interval: Seconds between garbage-collection passes in the compactor process
            after a pass that deleted something.
        gc_max_interval: Ceiling of the interval between passes while they delete nothing
            (each such pass doubles it; a pass lists the whole database).
        gc_min_age: Seconds an unreferenced compacted SST or temporary object must exist, and
            a superseded manifest must stay superseded, before GC deletes it. Must exceed the
            longest compaction (a compactor abandons work older than half of it) and the
            writer's view refresh.
        gc_when_alone: On ``file://``, a writer whose store is the only one open on the
            database (an ``flock``; RFC 0029) collects superseded objects at once and GCs
            every second. Set False when the directory is shared with other machines by a
            filesystem whose ``flock`` does not reach them (some FUSE or SMB mounts; Linux
            NFS is fine).
        file_sync: ``"fsync"`` (default) makes a ``file://`` write durable before it is
            acknowledged: the file and its directory are fsynced before a WAL SST, a manifest
            or a compacted SST counts as written. ``"off"`` skips that (faster; a power loss
            or kernel crash may then lose acknowledged writes). ``"fsync-file"`` makes a
            create (every WAL SST) cost one fsync instead of two: the new file alone, after
            it is linked into place, relying on a journaling filesystem (ext4 with its
            default ``data=ordered``, XFS, btrfs) to make a new file's name durable with
            it; not for ext2, ext4 without a journal, or network and FUSE filesystems (RFC
            0006, issue 33 addendum). Other stores ignore it.
        reader_gap_timeout: Seconds a reader waits for a missing WAL SST below later ones
            before it reports the gap as corruption (when the gap is wider than any writer's
            in-flight window, so no live writer can still be filling it).
        block_cache_bytes: Memory for decoded SST data blocks (per writer or reader),
            counted at the blocks' Python object sizes (within a few % of
            ``sys.getsizeof`` of their parts). 32 MiB by default (RocksDB's default block
            cache too; was 64 MiB): with the other defaults a process's peak RSS stays
            under 256 MB at 2M keys (docs/performance.md, "Memory"); the allocator holds
            1.5-1.8x what the cache counts once it churns. Raise it when the data read
            often is larger.
        meta_cache_bytes: Memory for SST index and filter partitions; the top-level index of
            every SST in the current view is kept in memory besides (a few KB per SST).
        scan_read_ahead_bytes: Largest ranged GET a scan issues while reading ahead. The
            sources of a merged scan (L0 SSTs, sorted runs) share it: each reads chunks of
            at most its share (but 64 KiB), so a scan's read-ahead memory does not grow
            with the number of sources.
        scan_requests_in_flight: Ranged GETs a scan keeps in flight ahead of the block it
            is decoding (each at most ``scan_read_ahead_bytes``, so a scan holds up to one
            more chunk than this in memory: 20 MiB by default): through a slow store, a
            scan's bandwidth is about this many requests' worth per round trip.
        disk_cache: Local disk cache of SST data from the object store: ``"auto"`` (on for
            ``s3://``, ``gs://``, ``az://``; off for ``memory://`` and ``file://``), ``"on"``,
            ``"off"``.
        disk_cache_dir: Where the disk cache lives (shared by processes on one machine);
            ``$XDG_CACHE_HOME/slatepy`` (or ``~/.cache/slatepy``) when unset.
        disk_cache_bytes: Size bound of the disk cache; least recently used parts go first.
        azure_account: Azure storage account; ``AZURE_STORAGE_ACCOUNT_NAME`` when unset.
        azure_access_key: Azure account key; ``AZURE_STORAGE_ACCOUNT_KEY`` when unset.
        azure_endpoint: Azure Blob endpoint URL (e.g. Azurite's); inferred when unset.
        azure_use_emulator: Talk to a local Azurite with its well-known account;
            ``AZURE_STORAGE_USE_EMULATOR`` when unset.
        gcs_endpoint: Google Cloud Storage endpoint URL (an emulator); Google's when unset.
        compression: Per-block compression of the SSTs this process writes (WAL SSTs by a
            writer, compacted SSTs by a compactor): ``"none"`` (default), ``"lz4"`` (fast)
            or ``"zstd"`` (smaller). A block that does not shrink is stored raw; SSTs of any
            setting stay readable under any other (RFC 0018).
        compression_level: The codec's level; 0 (default) is the codec's own default.
            zstd: -7..22 (negative levels are faster); lz4: 1..12 selects its
            high-compression mode (slower writes, reads as fast).
        default_ttl: Seconds a value put without ``ttl=`` lives (RFC 0019); None (default):
            values do not expire. Runtime-only options that are not data (the clock TTLs are
            measured with) are ``Db.open`` keyword arguments instead.
        malloc_mmap_threshold: Linux with glibc, opt-in: a writer's open fixes the
            process's malloc mmap threshold at this many bytes (131072, glibc's initial
            value, is the useful one), so that the large buffers writes and compaction free
            go back to the system instead of staying in the heap (``slatepy.engine.malloc``:
            peak RSS of a writer -20% or more). Process-wide and once per process (the first
            writer's value): every allocation of the host application at or above it then
            costs an ``mmap``/``munmap`` (numpy temporaries of 2 MiB ran 14x slower), which
            is why ``None`` (default) leaves the allocator alone; so does
            ``MALLOC_MMAP_THRESHOLD_`` in the environment, the same knob for the whole
            process.
        malloc_arena_max: Linux with glibc: the first writer's or reader's open caps the
            process's malloc arenas at this many (``mallopt(M_ARENA_MAX)``; glibc's default
            is eight per core, one per allocating thread), so that the memory one thread
            frees (the compactor's, the WAL flusher's) serves the others instead of staying
            in its own arena: a 2M-key writer's peak RSS 142-147 MB with 1 (default),
            181-204 MB without (``slatepy.engine.malloc``). Process-wide and once per
            process; threads that allocated before keep their arenas. ``None`` leaves the
            allocator alone; so does ``MALLOC_ARENA_MAX`` (or ``glibc.malloc.arena_max``
            in ``GLIBC_TUNABLES``) in the environment.
    """

    flush_interval: float = 0.1
    flush_bytes: int = 4 * 1024 * 1024
    block_size: int = 16 * 1024
    bloom_bits_per_key: int = 10
    manifest_update_attempts: int = 64
    writer_snapshot_ttl: float = 300.0
    max_parallel_writes: int = 1
    max_unflushed_bytes: int = 64 * 1024 * 1024
    memtable_retain_bytes: int | None = None
    write_stall_timeout: float = 60.0
    wal_write_attempts: int = 8
    store_timeout: float = 30.0
    store_connect_timeout: float = 5.0
    store_retries: int = 3
    request_attempts: int = 4
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None
    s3_session_token: str | None = None
    s3_allow_http: bool | None = None
    instance_credentials: bool = False
    cas: Literal["conditional", "dynamodb"] = "conditional"
    dynamodb_table: str | None = None
    dynamodb_endpoint: str | None = None
    dynamodb_region: str | None = None
    compactor: Literal["in-process", "off"] = "in-process"
    compaction_interval: float = 1.0
    compaction_max_interval: float = 15.0
    compactor_lease: float = 30.0
    close_compaction_wait: float = 10.0
    close_merge_rate: int = 32 * 1024 * 1024
    reader_poll_interval: float = 0.1
    reader_max_poll_interval: float = 5.0
    reader_snapshot_ttl: float = 60.0
    gc_interval: float = 60.0
    gc_max_interval: float = 600.0
    gc_min_age: float = 3600.0
    gc_when_alone: bool = True
    file_sync: Literal["fsync", "fsync-file", "off"] = "fsync"
    reader_gap_timeout: float = 10.0
    block_cache_bytes: int = 32 * 1024 * 1024
    meta_cache_bytes: int = 64 * 1024 * 1024
    scan_read_ahead_bytes: int = 4 * 1024 * 1024
    scan_requests_in_flight: int = 4
    disk_cache: Literal["auto", "on", "off"] = "auto"
    disk_cache_dir: str | None = None
    disk_cache_bytes: int = 4 * 1024 * 1024 * 1024
    azure_account: str | None = None
    azure_access_key: str | None = None
    azure_endpoint: str | None = None
    azure_use_emulator: bool | None = None
    gcs_endpoint: str | None = None
    compression: Literal["none", "zstd", "lz4"] = "none"
    compression_level: int = 0
    default_ttl: float | None = None
    malloc_mmap_threshold: int | None = None
    malloc_arena_max: int | None = 1

    def __post_init__(self) -> None:
        # The constructor does not check types (only decoding does): a misspelt Literal
        # such as compactor="background" would otherwise be accepted and silently ignored.
        for name, annotation in _field_types().items():
            _check_type(name, getattr(self, name), annotation)
        checks: list[tuple[bool, str]] = [
            (self.flush_interval > 0, "flush_interval must be > 0 seconds"),
            (self.flush_bytes >= 1024, "flush_bytes must be >= 1024"),
            (512 <= self.block_size <= 1 << 24, "block_size must be in [512, 16 MiB]"),
            (1 <= self.bloom_bits_per_key <= 64, "bloom_bits_per_key must be in [1, 64]"),
            (self.manifest_update_attempts >= 1, "manifest_update_attempts must be >= 1"),
            (self.writer_snapshot_ttl > 0, "writer_snapshot_ttl must be > 0"),
            (1 <= self.max_parallel_writes <= 64, "max_parallel_writes must be in [1, 64]"),
            (
                self.max_unflushed_bytes >= self.flush_bytes,
                "max_unflushed_bytes must be >= flush_bytes",
            ),
            (
                self.memtable_retain_bytes is None
                or 0 <= self.memtable_retain_bytes <= self.max_unflushed_bytes // 2,
                "memtable_retain_bytes must be in [0, max_unflushed_bytes / 2]",
            ),
            (self.write_stall_timeout > 0, "write_stall_timeout must be > 0"),
            (
                self.malloc_mmap_threshold is None
                or 4096 <= self.malloc_mmap_threshold <= 32 * 1024 * 1024,
                "malloc_mmap_threshold must be None or in [4 KiB, 32 MiB]",
            ),
            (
                self.malloc_arena_max is None or self.malloc_arena_max >= 1,
                "malloc_arena_max must be None or >= 1",
            ),
            (self.wal_write_attempts >= 1, "wal_write_attempts must be >= 1"),
            (self.store_timeout > 0, "store_timeout must be > 0"),
            (self.store_connect_timeout > 0, "store_connect_timeout must be > 0"),
            (self.store_retries >= 0, "store_retries must be >= 0"),
            (self.request_attempts >= 1, "request_attempts must be >= 1"),
            (self.compaction_interval > 0, "compaction_interval must be > 0"),
            (
                self.compactor_lease >= 3 * self.compaction_interval,
                "compactor_lease must be >= 3 * compaction_interval (a compactor must get to "
                "pending work and renew well within its lease)",
            ),
            (self.reader_poll_interval > 0, "reader_poll_interval must be > 0"),
            (self.reader_max_poll_interval > 0, "reader_max_poll_interval must be > 0"),
            (self.compaction_max_interval > 0, "compaction_max_interval must be > 0"),
            (self.gc_max_interval > 0, "gc_max_interval must be > 0"),
            (self.reader_snapshot_ttl >= 1, "reader_snapshot_ttl must be >= 1 second"),
            (self.gc_interval > 0, "gc_interval must be > 0"),
            (self.gc_min_age >= 0, "gc_min_age must be >= 0"),
            (self.reader_gap_timeout >= 0, "reader_gap_timeout must be >= 0"),
            (self.block_cache_bytes >= 0, "block_cache_bytes must be >= 0"),
            (self.meta_cache_bytes >= 1 << 20, "meta_cache_bytes must be >= 1 MiB"),
            (
                64 * 1024 <= self.scan_read_ahead_bytes <= 256 * 1024 * 1024,
                "scan_read_ahead_bytes must be in [64 KiB, 256 MiB]",
            ),
            (self.close_compaction_wait >= 0, "close_compaction_wait must be >= 0"),
            (self.close_merge_rate > 0, "close_merge_rate must be > 0"),
            (
                1 <= self.scan_requests_in_flight <= 64,
                "scan_requests_in_flight must be in [1, 64]",
            ),
            (self.disk_cache_bytes >= 16 << 20, "disk_cache_bytes must be >= 16 MiB"),
            (
                _LEVELS[self.compression][0]
                <= self.compression_level
                <= _LEVELS[self.compression][1],
                f"compression_level must be in {_LEVELS[self.compression]} for "
                f"compression={self.compression!r} (0 is the codec's default)",
            ),
        ]
        checks.append(
            (
                self.default_ttl is None or 0 < self.default_ttl < float("inf"),
                "default_ttl must be a positive number of seconds (or unset: no expiry)",
            )
        )
        checks.append(
            (
                self.cas != "dynamodb" or bool(self.dynamodb_table),
                'cas="dynamodb" needs dynamodb_table',
            )
        )
        for ok, message in checks:
            if not ok:
                raise InvalidArgument(message)

    def __repr__(self) -> str:
        """Every option, secrets masked as ``'***'`` (and None when unset)."""
        shown = (
            f"{name}={'***' if name in SECRETS and value is not None else value!r}"
            for name, value in ((n, getattr(self, n)) for n in self.__struct_fields__)
        )
        return f"Settings({', '.join(shown)})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        """What ``rich`` prints: the same masking as ``repr``."""
        return [
            (name, "***" if name in SECRETS and value is not None else value)
            for name, value in ((n, getattr(self, n)) for n in self.__struct_fields__)
        ]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Build settings from a mapping, converting strings such as ``"0.05"``.

        Raises:
            InvalidArgument: an unknown option (with the closest known name), a value of the
                wrong type, or a value out of range.
        """
        for name in data:
            if name not in cls.__struct_fields__:
                raise InvalidArgument(
                    f"unknown setting {name!r}{_did_you_mean(name, cls.__struct_fields__)}"
                )
        try:
            return msgspec.convert(data, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise InvalidArgument(f"invalid settings: {exc}") from exc

    @classmethod
    def from_toml(cls, path: str | Path) -> Self:
        """Build settings from a TOML file whose top-level keys are option names."""
        with open(path, "rb") as f:
            return cls.from_dict(tomllib.load(f))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """Build settings from ``SLATEPY_<OPTION>`` variables, then apply ``overrides``.

        Raises:
            InvalidArgument: a ``SLATEPY_*`` variable names no option (a typo would otherwise
                be ignored without a word); ``SLATEPY_TEST_*`` belongs to the test suite.
        """
        env = os.environ if environ is None else environ
        options = {f"SLATEPY_{name.upper()}": name for name in cls.__struct_fields__}
        data: dict[str, Any] = {}
        for variable, value in env.items():
            if not variable.startswith("SLATEPY_") or variable.startswith(NOT_SETTINGS):
                continue
            if variable not in options:
                raise InvalidArgument(
                    f"environment variable {variable} names no setting"
                    f"{_did_you_mean(variable, options)}"
                )
            data[options[variable]] = value
        data.update(overrides)
        return cls.from_dict(data)


_LEVELS = {"none": (0, 0), "zstd": (-7, 22), "lz4": (0, 12)}
"""Accepted ``compression_level`` range per codec (``slatepy.format.compression`` has the
same; settings sit above the format layer and do not import it)."""

NOT_SETTINGS = ("SLATEPY_TEST_", "SLATEPY_PERSIST_", "SLATEPY_CONFIG")
"""``SLATEPY_*`` variables that are not settings (the test suite's own, persist's switches,
and ``SLATEPY_CONFIG``, the TOML file :func:`resolve_settings` reads)."""

CONFIG_VARIABLE = "SLATEPY_CONFIG"
"""Names a TOML settings file read when no ``settings=`` path is given."""

SettingsLike = Settings | Mapping[str, Any] | str | os.PathLike[str] | None
"""What every ``settings=`` takes: a ``Settings``, a dict of option names, or a TOML path."""


def resolve_settings(
    settings: SettingsLike = None, *, environ: Mapping[str, str] | None = None
) -> Settings:
    """The settings an entry point (``Db.open``, ``DbReader.open``, ``WalReader.open``,
    ``PersistClient.open``, the Spark sources, the CLI) runs with, by one precedence:

    1. explicit values: a dict's entries, or the fields of a ``Settings`` that differ from
       their defaults (a field left at its default is taken as unset);
    2. ``SLATEPY_<OPTION>`` environment variables;
    3. a TOML file: ``settings`` itself when it is a path, else ``$SLATEPY_CONFIG``;
    4. defaults (and, for an option still unset, the provider's variables such as
       ``AWS_REGION``, which the store reads when it is opened).

    Resolving twice gives the same settings, so layers below an entry point may call it.

    Raises:
        InvalidArgument: an unknown option (in the dict, the file or a variable), a bad
            value, or a settings file that cannot be read.
    """
    env = os.environ if environ is None else environ
    explicit: dict[str, Any]
    path: str | os.PathLike[str] | None = env.get(CONFIG_VARIABLE) or None
    if settings is None:
        explicit = {}
    elif isinstance(settings, Settings):
        explicit = _non_defaults(settings)
    elif isinstance(settings, (str, os.PathLike)):
        explicit, path = {}, settings
    elif isinstance(settings, Mapping):
        explicit = dict(settings)
    else:
        raise InvalidArgument(
            "settings must be a Settings, a dict or a TOML file path, "
            f"not {type(settings).__name__}"
        )
    # Layers are merged raw and validated once, together: a bound between two options
    # (compactor_lease >= 3 * compaction_interval) holds of the result, not of each layer.
    data: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                data.update(tomllib.load(f))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgument(f"cannot read the settings file {str(path)!r}: {exc}") from exc
        for name in data:
            if name not in Settings.__struct_fields__:
                raise InvalidArgument(
                    f"unknown setting {name!r} in {str(path)!r}"
                    f"{_did_you_mean(name, Settings.__struct_fields__)}"
                )
    data.update(_environment_values(env))
    data.update(explicit)
    return Settings.from_dict(data)


def _environment_values(env: Mapping[str, str]) -> dict[str, str]:
    """The ``SLATEPY_<OPTION>`` variables as ``{option: text}`` (as ``Settings.from_env``
    reads them, without validating them alone)."""
    options = {f"SLATEPY_{name.upper()}": name for name in Settings.__struct_fields__}
    values: dict[str, str] = {}
    for variable, value in env.items():
        if not variable.startswith("SLATEPY_") or variable.startswith(NOT_SETTINGS):
            continue
        if variable not in options:
            raise InvalidArgument(
                f"environment variable {variable} names no setting"
                f"{_did_you_mean(variable, options)}"
            )
        values[options[variable]] = value
    return values


def _non_defaults(settings: Settings) -> dict[str, Any]:
    return {
        field.name: getattr(settings, field.name)
        for field in msgspec.structs.fields(settings)
        if getattr(settings, field.name) != field.default
    }


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(Settings)


def _check_type(name: str, value: object, annotation: Any) -> None:
    """Raise ``InvalidArgument`` unless ``value`` fits ``annotation`` (a field's type)."""
    if typing.get_origin(annotation) is Literal:
        allowed = typing.get_args(annotation)
        if value not in allowed:
            choices = ", ".join(repr(a) for a in allowed)
            raise InvalidArgument(f"{name}={value!r} is not one of {choices}")
        return
    try:
        msgspec.convert(value, annotation, strict=True)
    except msgspec.ValidationError as exc:
        raise InvalidArgument(f"{name}={value!r}: {exc}") from None
