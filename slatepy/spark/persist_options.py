"""The options every ``slatepy.persist`` source and sink takes: which location and shard."""

from __future__ import annotations

from collections.abc import Mapping

from slatepy.errors import InvalidArgument
from slatepy.persist.ids import validate_shard_id
from slatepy.spark.kv import plain_path_url


def shard_options(
    options: Mapping[str, str], allowed: frozenset[str] | set[str]
) -> tuple[dict[str, str], str, str]:
    """``(options lower-cased, url, shard)`` after checking that every option is known and
    that ``url`` (or Spark's ``path``) and a valid ``shard`` are given.

    Raises:
        InvalidArgument: naming the unknown, missing or malformed option.
    """
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(set(opts) - allowed)
    if unknown:
        raise InvalidArgument(
            f"slatepy.persist: unknown option(s) {unknown}; known: {sorted(allowed - {'path'})}"
        )
    url = opts.get("url") or opts.get("path")
    if not url:
        raise InvalidArgument('slatepy.persist: option "url" is required (the persist location)')
    url = plain_path_url(url)
    shard = opts.get("shard")
    if not shard:
        raise InvalidArgument('slatepy.persist: option "shard" is required (the shard id)')
    try:
        validate_shard_id(shard)
    except Exception as exc:
        raise InvalidArgument(f'slatepy.persist: option "shard": {exc}') from exc
    return opts, url, shard
