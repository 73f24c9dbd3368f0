"""Create-if-absent with indefinite outcomes resolved.

Every immutable object slatepy writes (WAL SSTs, manifests) goes through
:func:`create_if_absent`. A create that times out may still have landed; the retry then
finds "already exists". We resolve that by reading the object back: if it holds exactly our
bytes, the earlier attempt won and the write succeeded; otherwise somebody else owns the slot.
"""

from __future__ import annotations

import time

from slatepy.errors import AlreadyExists, NotFound, StoreUnavailable
from slatepy.store.base import ObjectStore, PutData


def create_if_absent(
    store: ObjectStore, path: str, data: PutData, *, attempts: int = 5, backoff: float = 0.05
) -> bytes | None:
    """Create ``path`` holding ``data`` unless it exists.

    Returns:
        ``None`` when ``data`` is now at ``path`` because of this call, otherwise the bytes of
        the object somebody else created there.

    Raises:
        StoreUnavailable: every attempt failed; ``definite`` is False if any attempt may
            have landed (the caller must treat the slot as unknown).
    """
    uncertain = False
    for attempt in range(attempts):
        try:
            store.put(path, data, mode="create")
            return None
        except AlreadyExists:
            try:
                existing = store.get(path)
            except NotFound:
                continue  # deleted between our put and get; the slot is free again
            return None if existing == data else existing
        except StoreUnavailable as exc:
            uncertain = uncertain or not exc.definite
            if attempt == attempts - 1:
                raise StoreUnavailable(
                    f"creating {path} failed after {attempts} attempts: {exc}",
                    path=path,
                    definite=not uncertain,
                ) from exc
            time.sleep(backoff * (2**attempt))
    raise StoreUnavailable(f"creating {path}: the object kept vanishing", path=path, definite=False)
