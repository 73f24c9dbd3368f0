"""Catalog schema migrations: a chain of pure functions, one per version step (RFC 0028 §5).

``MIGRATIONS[v]`` turns version-``v`` objects into version ``v + 1`` ones; each lives in its
own frozen module (``vN_to_vN+1.py``) with its own copies of the types it reads and writes,
so later changes to :mod:`slatepy.catalog.objects` never change what an old step does. The
chain, not the step, moves config ``catalog_version``. Config and the audit log are never
migrated by a step.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from slatepy.catalog.errors import CatalogError, IncompatibleCatalogVersion
from slatepy.catalog.objects import CATALOG_VERSION, ConfigKey, ConfigValue, Objects
from slatepy.catalog.upgrade import v1_to_v2

MIN_CATALOG_VERSION = 1
"""The oldest version this code migrates from."""

MIGRATIONS: dict[int, Callable[[Objects], Objects]] = {1: v1_to_v2.migrate}

_VERSION_KEY = msgspec.json.encode(ConfigKey("catalog_version"))


def catalog_version(objects: Objects) -> int:
    """The version recorded in ``objects`` (config ``catalog_version``).

    Raises:
        IncompatibleCatalogVersion: there is none (a catalog written by something else).
        CatalogError: it does not decode (corrupt).
    """
    raw = objects.get("config", {}).get(_VERSION_KEY)
    if raw is None:
        raise IncompatibleCatalogVersion(
            "the catalog records no catalog_version in its config collection",
            found=0,
            code=CATALOG_VERSION,
        )
    try:
        return msgspec.json.decode(raw, type=ConfigValue).value
    except msgspec.DecodeError as exc:
        raise CatalogError(
            f"corrupt: config {_VERSION_KEY.decode()} does not decode ({exc}); "
            "`slatepy catalog edit` repairs it"
        ) from None


def check_version(found: int, code: int = CATALOG_VERSION) -> None:
    """Raise unless this code can open a catalog at version ``found``.

    Raises:
        IncompatibleCatalogVersion: ``found`` is newer than ``code`` or older than the
            oldest version there is a migration from.
    """
    if found > code:
        raise IncompatibleCatalogVersion(
            f"the catalog is at version {found}, newer than this code's version {code}: "
            "upgrade slatepy to open it",
            found=found,
            code=code,
        )
    if found < MIN_CATALOG_VERSION:
        raise IncompatibleCatalogVersion(
            f"the catalog is at version {found}, older than the oldest this code migrates "
            f"from ({MIN_CATALOG_VERSION}; this code's version is {code})",
            found=found,
            code=code,
        )


def upgrade(objects: Objects, code: int = CATALOG_VERSION) -> tuple[Objects, int]:
    """``objects`` migrated to version ``code``, and the version they were at.

    Raises:
        IncompatibleCatalogVersion: see :func:`check_version`.
        CatalogError: a step failed on an object that is not of its version.
    """
    found = catalog_version(objects)
    check_version(found, code)
    for version in range(found, code):
        try:
            objects = MIGRATIONS[version](objects)
        except msgspec.MsgspecError as exc:
            raise CatalogError(
                f"migrating the catalog from version {version} to {version + 1} failed: {exc}"
            ) from None
        objects.setdefault("config", {})[_VERSION_KEY] = msgspec.json.encode(
            ConfigValue(version + 1)
        )
    return objects, found
