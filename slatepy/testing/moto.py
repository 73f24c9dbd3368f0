"""An S3/DynamoDB wire-protocol server (moto) on 127.0.0.1 for tests.

Tests talk real HTTP to it through obstore and boto3, so the S3 code paths (signing,
conditional-put status codes, error bodies) are exercised, not mocked.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

TEST_REGION = "us-east-1"
TEST_KEY_ID = "testing"
TEST_SECRET = "testing"


@dataclass(frozen=True, slots=True)
class S3Endpoint:
    """Where a test S3 server listens and how to sign requests to it."""

    url: str
    region: str = TEST_REGION
    access_key_id: str = TEST_KEY_ID
    secret_access_key: str = TEST_SECRET


@contextmanager
def moto_server() -> Iterator[S3Endpoint]:
    """Run a threaded moto server on a free port of 127.0.0.1 for the ``with`` block."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3Endpoint(f"http://{host}:{port}")
    finally:
        server.stop()


def create_bucket(endpoint: S3Endpoint, bucket: str) -> None:
    """Create ``bucket`` on the test server (boto3 over HTTP); existing buckets are kept."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint.url,
        region_name=endpoint.region,
        aws_access_key_id=endpoint.access_key_id,
        aws_secret_access_key=endpoint.secret_access_key,
    )
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)
