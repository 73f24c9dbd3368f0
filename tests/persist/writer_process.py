"""A persist writer in a process of its own, for the tests of readers in another one:
``python -m tests.persist.writer_process URL SHARD N`` appends ``((b"k{t}", b"v"), t, 1)``
for ``t`` in ``0..N-1``, one call each, then closes the shard (upper ``None``)."""

from __future__ import annotations

import sys

from slatepy.persist import PersistClient


def main(url: str, shard: str, count: int) -> None:
    with PersistClient.open(url) as client:
        write = client.open_writer(shard, purpose="test writer process")
        for t in range(count):
            write.compare_and_append([((b"k%d" % t, b"v"), t, 1)], t, t + 1)
        write.compare_and_append([], count, None)
        write.expire()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
