"""A TCP proxy on 127.0.0.1 that makes a local S3 server (moto, MinIO) as slow as a real one.

Each HTTP request pays ``delay`` ± ``jitter`` seconds before it reaches the server: the proxy
holds the first bytes a client sends after the previous response (or on a new connection),
which is where a request begins on a keep-alive HTTP/1.1 connection. Everything else streams
through untouched, so bandwidth stays the server's. Because it sits on the wire, slatepy and
SlateDB's Rust client pay the same latency in the same run (a Python store wrapper could only
slow down slatepy).

It also counts the requests it delays by billing kind (:func:`request_kind`: GET, PUT, POST,
LIST, HEAD, DELETE), whichever client sent them: the only way to count SlateDB's requests,
and a check on slatepy's own store metrics.

    with LatencyProxy("127.0.0.1", moto_port, delay=0.030, jitter=0.010) as proxy:
        endpoint = proxy.url   # http://127.0.0.1:<port>
        ...
        proxy.counts()         # {"PUT": 12, "GET": 40, "LIST": 3, ...}
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from types import TracebackType

CHUNK = 256 * 1024
METHODS = (b"GET", b"PUT", b"POST", b"HEAD", b"DELETE")


def request_kind(first_bytes: bytes) -> str | None:
    """The S3 request kind of an HTTP request starting with ``first_bytes``, or None when
    they do not start a request (a body sent after ``100 Continue``, say).

    A GET with ``list-type=`` or ``prefix=`` in its query is a LIST; a POST of
    ``?delete`` (multi-object delete) a DELETE; other POSTs (multipart create and complete)
    stay POST, billed as PUTs; a PUT with ``x-amz-copy-source`` (a COPY) stays PUT.
    """
    line = first_bytes.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3 or parts[0] not in METHODS or not parts[2].startswith(b"HTTP/"):
        return None
    method, target = parts[0].decode(), parts[1]
    query = target.partition(b"?")[2]
    if method == "GET" and (b"list-type=" in query or b"prefix=" in query):
        return "LIST"
    if method == "POST" and b"delete" in (p.partition(b"=")[0] for p in query.split(b"&")):
        return "DELETE"
    return method


class LatencyProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port`` with per-request delay.

    Attributes:
        requests: Requests delayed so far (one per HTTP request on a connection).
    """

    def __init__(
        self, target_host: str, target_port: int, *, delay: float, jitter: float = 0.0
    ) -> None:
        self.target = (target_host, target_port)
        self.delay, self.jitter = delay, jitter
        self.requests = 0
        self._kinds: Counter[str] = Counter()
        self._kinds_lock = threading.Lock()
        self.port = 0
        self._rng = random.Random(0)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._serve, name="latency-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def counts(self) -> dict[str, int]:
        """Requests so far by kind (see :func:`request_kind`)."""
        with self._kinds_lock:
            return dict(self._kinds)

    def __enter__(self) -> LatencyProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the latency proxy did not start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        """Close the listener and every open connection's tasks."""
        if self._server is not None:
            self._server.close()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _connection(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        responded = asyncio.Event()
        responded.set()  # the first bytes of a connection start a request

        async def request_begins(data: bytes) -> None:
            if responded.is_set():  # the first bytes after a response start a new request
                kind = request_kind(data)
                if kind is None:
                    return  # not a request line: the rest of one (a body after a 100)
                responded.clear()
                self.requests += 1
                with self._kinds_lock:
                    self._kinds[kind] += 1
                wait = self.delay + self._rng.uniform(-self.jitter, self.jitter)
                await asyncio.sleep(max(0.0, wait))

        async def response_seen(data: bytes) -> None:
            responded.set()

        await asyncio.gather(
            _pump(client_reader, server_writer, request_begins),
            _pump(server_reader, client_writer, response_seen),
            return_exceptions=True,
        )


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    before_chunk: Callable[[bytes], Awaitable[None]],
) -> None:
    """Copy ``reader`` to ``writer``, awaiting ``before_chunk(chunk)`` ahead of each chunk."""
    try:
        while data := await reader.read(CHUNK):
            await before_chunk(data)
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
