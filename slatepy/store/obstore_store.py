"""``ObjectStore`` over ``obstore``: one implementation for memory, file, S3, GCS and Azure."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import obstore
from obstore import exceptions as obx
from obstore.store import AzureStore, LocalStore
from obstore.store import ObjectStore as RawStore

from slatepy.errors import (
    AlreadyExists,
    NotDurable,
    NotFound,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
    UnsupportedStore,
)
from slatepy.store.attach import USERS_FILE
from slatepy.store.base import IfMatch, ObjectMeta, ObjectStore, ObjectWriter, PutData, PutMode
from slatepy.store.fsync import CreateRefused, FileSync, NotSynced
from slatepy.store.local_read import KeptReads, LocalReads

if TYPE_CHECKING:
    from obstore import GetOptions, WritableFile

T = TypeVar("T")

_MISSING_BUCKET_MARKERS = ("NoSuchBucket", "ContainerNotFound", "The specified bucket does not")

# How often the HEAD + range GET replacement of a suffix read starts over because the object
# was replaced between the two requests (its ETag changed). Slatepy's objects are written once,
# so a second attempt is already a rarity; the bound keeps an object rewritten in a loop from
# holding a reader forever.
_SUFFIX_FALLBACK_ATTEMPTS = 3

STREAM_PART_BYTES = 8 * 1024 * 1024
"""Part size of a streamed write (``open_writer``): S3's minimum is 5 MiB. With
``STREAM_CONCURRENCY`` parts in flight, a stream holds at most about three parts."""
STREAM_CONCURRENCY = 2


class ObstoreStore(ObjectStore):
    """An ``ObjectStore`` backed by an ``obstore`` store instance.

    Args:
        raw: The obstore store (already rooted at the database prefix).
        url: The URL to report (without credentials).
        file_sync: For a ``LocalStore``: fsyncs every put, copy and delete before it returns
            (``Settings.file_sync="fsync"``). ``None`` leaves durability to the backend.
        local_reads: For a ``LocalStore``: serves reads from the files directly (see
            :mod:`slatepy.store.local_read`).
    """

    def __init__(
        self,
        raw: RawStore,
        url: str,
        *,
        file_sync: FileSync | None = None,
        local_reads: LocalReads | None = None,
    ) -> None:
        self._raw = raw
        self._url = url
        self._sync = file_sync
        self._local = local_reads
        # obstore refuses suffix ranges on Azure ("Azure does not support suffix range
        # requests"); other backends that turn out to refuse them switch on first refusal.
        self._suffix = not isinstance(raw, AzureStore)

    @property
    def url(self) -> str:
        return self._url

    @property
    def supports_if_match(self) -> bool:
        # LocalStore implements If-Match writes non-atomically (measured; see DESIGN §2).
        return not isinstance(self._raw, LocalStore)

    @property
    def supports_suffix(self) -> bool:
        return self._suffix

    def get(self, path: str) -> bytes:
        if self._local is not None:
            return self._local.get(path)
        return self._call(path, False, lambda: obstore.get(self._raw, path).bytes().to_bytes())

    def get_range(self, path: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        if self._local is not None:
            return self._local.get_range(path, start, end)
        return self._call(
            path, False, lambda: obstore.get_range(self._raw, path, start=start, end=end).to_bytes()
        )

    def kept_reads(self, path: str) -> KeptReads | None:
        return None if self._local is None else self._local.kept_reads(path)

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        # obstore rejects empty ranges (ValueError), so only non-empty ones are requested.
        wanted = [(s, e) for s, e in ranges if e > s]
        if not wanted:
            return [b""] * len(ranges)
        if self._local is not None:
            if len(wanted) == len(ranges):
                return self._local.get_ranges(path, wanted)
            local = iter(self._local.get_ranges(path, wanted))
            return [next(local) if e > s else b"" for s, e in ranges]
        starts = [s for s, _ in wanted]
        ends = [e for _, e in wanted]
        parts = iter(
            self._call(
                path, False, lambda: obstore.get_ranges(self._raw, path, starts=starts, ends=ends)
            )
        )
        return [next(parts).to_bytes() if e > s else b"" for s, e in ranges]

    def get_suffix(self, path: str, length: int) -> bytes:
        """Return the last ``length`` bytes: one suffix GET, or a HEAD and a range GET.

        The two-request form serves backends without suffix ranges (``supports_suffix`` is
        False). Its GET carries the HEAD's ETag as ``If-Match``, so the bytes always come from
        the object whose size was measured, never from a replacement written in between.
        """
        if length <= 0:
            self.head(path)  # still NotFound for a missing object, like a suffix GET
            return b""
        if self._local is not None:
            return self._local.get_suffix(path, length)
        if self._suffix:

            def run() -> bytes:
                result = obstore.get(self._raw, path, options={"range": {"suffix": length}})
                return result.bytes().to_bytes()

            try:
                return self._call(path, False, run)
            except UnsupportedStore:
                self._suffix = False
        return self._suffix_by_head(path, length)

    def _suffix_by_head(self, path: str, length: int) -> bytes:
        for _ in range(_SUFFIX_FALLBACK_ATTEMPTS):
            meta = self.head(path)
            start = max(0, meta.size - length)
            if start == meta.size:
                return b""  # an empty object: a range GET of nothing is refused (416)
            options: GetOptions = {"range": {"offset": start}}
            if meta.e_tag is not None:
                options["if_match"] = meta.e_tag

            def run(options: GetOptions = options) -> bytes:
                return obstore.get(self._raw, path, options=options).bytes().to_bytes()

            try:
                return self._call(path, False, run)
            except PreconditionFailed:
                continue  # replaced between HEAD and GET: measure the new object
        raise StoreUnavailable(
            f"reading the end of {path} on {self._url}: the object was replaced "
            f"{_SUFFIX_FALLBACK_ATTEMPTS} times while it was being read; retry later",
            path=path,
            definite=True,
        )

    def head(self, path: str) -> ObjectMeta:
        return _meta(self._call(path, False, lambda: obstore.head(self._raw, path)))

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        if mode == "create" and self._sync is not None:
            return self._create_durably(self._sync, path, data)
        raw_mode: Any = {"e_tag": mode.e_tag} if isinstance(mode, IfMatch) else mode
        result = self._call(
            path,
            True,
            lambda: obstore.put(self._raw, path, data, mode=raw_mode, use_multipart=False),
        )
        if self._sync is not None:
            self._durable(path, self._sync.written)
        return result.get("e_tag")

    def _create_durably(self, sync: FileSync, path: str, data: PutData) -> str:
        """A ``file://`` create written by :meth:`FileSync.create` rather than obstore: the
        bytes fsynced before the name exists, without obstore's runtime hop (RFC 0007)."""
        try:
            return sync.create(path, data)
        except CreateRefused as exc:
            raise AlreadyExists(f"object already exists: {path}", path=path) from exc
        except NotSynced as exc:
            raise NotDurable(
                f"{path} on {self._url} was written but could not be made durable "
                f"(fsync failed: {exc}); check the disk and the directory's permissions",
                path=path,
                definite=False,
            ) from exc
        except OSError as exc:  # before the link: nothing is visible, a retry is safe
            raise StoreUnavailable(
                f"store request for {path} on {self._url} failed: {exc}",
                path=path,
                definite=False,
            ) from exc

    def open_writer(self, path: str) -> ObjectWriter:
        """A multipart upload in ``STREAM_PART_BYTES`` parts (one plain PUT if the object
        turns out smaller than a part); the backend client retries each part."""
        file = self._call(
            path,
            True,
            lambda: obstore.open_writer(
                self._raw, path, buffer_size=STREAM_PART_BYTES, max_concurrency=STREAM_CONCURRENCY
            ),
        )
        return _StreamWriter(self, path, file)

    def delete(self, path: str) -> None:
        with contextlib.suppress(NotFound):
            self._call(path, True, lambda: obstore.delete(self._raw, path))
        if self._sync is not None:
            # Also after NotFound: a retried delete whose first attempt unlinked must still sync.
            try:
                self._sync.removed(path)
            except OSError as exc:  # a delete may be retried: nothing is lost if it is undone
                raise StoreUnavailable(
                    f"deleting {path} on {self._url}: fsync of its directory failed: {exc}",
                    path=path,
                    definite=False,
                ) from exc

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        def run() -> Sequence[Any]:
            if offset is None:
                return obstore.list(self._raw, prefix).collect()
            return obstore.list(self._raw, prefix, offset=offset).collect()

        listed = (_meta(m) for m in self._call(prefix, False, run))
        # A file:// database's users lock (RFC 0029) is no object of the database.
        return sorted((m for m in listed if m.path != USERS_FILE), key=lambda m: m.path)

    def copy(self, source: str, destination: str) -> None:
        self._call(source, True, lambda: obstore.copy(self._raw, source, destination))
        if self._sync is not None:
            self._durable(destination, self._sync.written)

    def _durable(self, path: str, sync: Callable[[str], None]) -> None:
        """Run ``sync(path)`` after a put or copy; a failure leaves it visible, not durable.

        Raises:
            NotDurable: never retried (see the error).
        """
        try:
            sync(path)
        except OSError as exc:
            raise NotDurable(
                f"{path} on {self._url} was written but could not be made durable "
                f"(fsync failed: {exc}); check the disk and the directory's permissions",
                path=path,
                definite=False,
            ) from exc

    def _call(self, path: str, mutating: bool, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except FileNotFoundError as exc:
            _raise_not_found(path, exc)
        except obx.AlreadyExistsError as exc:
            raise AlreadyExists(f"object already exists: {path}", path=path) from exc
        except obx.PreconditionError as exc:
            raise PreconditionFailed(f"precondition failed for {path}", path=path) from exc
        except (obx.NotSupportedError, NotImplementedError) as exc:
            # NotImplementedError: e.g. LocalStore's If-Match puts (supports_if_match is False).
            raise UnsupportedStore(
                f"{self._url} does not support this operation: {_first_line(exc)}"
            ) from exc
        except (obx.PermissionDeniedError, obx.UnauthenticatedError) as exc:
            raise StoreUnavailable(
                f"access to {self._url} denied for {path}: {_first_line(exc)}",
                path=path,
                definite=True,
            ) from exc
        except (obx.BaseError, OSError) as exc:
            if any(marker in str(exc) for marker in _MISSING_BUCKET_MARKERS):
                _raise_not_found(path, exc)
            raise StoreUnavailable(
                f"store request for {path} on {self._url} failed: {_first_line(exc)}",
                path=path,
                definite=not mutating,
            ) from exc


class _StreamWriter(ObjectWriter):
    """``ObstoreStore.open_writer``'s writer (obstore's buffered multipart writer)."""

    def __init__(self, store: ObstoreStore, path: str, file: WritableFile) -> None:
        self._store = store
        self._path = path
        self._file: WritableFile | None = file
        self._size = 0

    def write(self, data: PutData) -> None:
        file = self._open()
        self._store._call(self._path, True, lambda: file.write(data))
        self._size += len(data)

    def commit(self) -> None:
        file = self._open()
        self._store._call(self._path, True, file.close)
        self._file = None
        if self._store._sync is not None:
            self._store._durable(self._path, self._store._sync.written)

    def abort(self) -> None:
        # obstore has no abort: dropping the writer discards a local upload's staging file;
        # an S3 multipart upload left incomplete is billed until a bucket lifecycle rule
        # (AbortIncompleteMultipartUpload) removes it (README; RFC 0011).
        self._file = None

    @property
    def requests(self) -> int:
        if self._size <= STREAM_PART_BYTES:
            return 1
        return -(-self._size // STREAM_PART_BYTES) + 2  # create + parts + complete

    def _open(self) -> WritableFile:
        if self._file is None:
            raise ValueError(f"streamed write of {self._path} already committed or aborted")
        return self._file


def _raise_not_found(path: str, exc: BaseException) -> NoReturn:
    if any(marker in str(exc) for marker in _MISSING_BUCKET_MARKERS):
        raise NotFound(f"the bucket or container does not exist ({path})", path=path) from exc
    raise NotFound(f"object not found: {path}", path=path) from exc


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _meta(raw: Any) -> ObjectMeta:
    return ObjectMeta(
        path=raw["path"],
        size=raw["size"],
        last_modified=raw["last_modified"],
        e_tag=raw.get("e_tag"),
    )


__all__ = ["ObstoreStore", "StoreError"]
