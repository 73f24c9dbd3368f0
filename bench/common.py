"""Where benchmarks run: a fresh database location on memory, file or S3 (moto on 127.0.0.1)."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from slatepy import Settings
from slatepy.testing.moto import create_bucket, moto_server


@contextmanager
def location(name: str, **overrides: object) -> Iterator[tuple[str, Settings]]:
    """``(url, settings)`` of an empty database location; settings default ``compactor="off"``
    so a benchmark counts only the requests of what it measures."""
    fields: dict[str, object] = {"compactor": "off", **overrides}
    if name == "memory":
        yield "memory://", Settings.from_dict(fields)
    elif name == "file":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"file://{tmp}/db", Settings.from_dict(fields)
    elif name == "s3":
        with moto_server(separate_process=True) as endpoint:
            create_bucket(endpoint, "bench")
            settings = Settings.from_dict(
                {
                    "s3_endpoint": endpoint.url,
                    "s3_access_key_id": endpoint.access_key_id,
                    "s3_secret_access_key": endpoint.secret_access_key,
                    **fields,
                }
            )
            yield f"s3://bench/{uuid.uuid4().hex[:8]}", settings
    else:
        raise SystemExit(f"unknown backend {name!r} (memory, file, s3)")
