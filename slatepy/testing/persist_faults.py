"""Faults and pauses for persist's ``Consensus``, for tests of everything built on it.

* :class:`FaultyConsensus` wraps a ``Consensus`` and gives each call one of the four outcomes
  of :mod:`slatepy.testing.faults` (ok, fail, timeout, lost reply) from a seeded random
  source: what the layers above (the CaS applier, handles) must survive.
* :class:`InterceptConsensus` calls hooks around chosen calls and can hold one call with
  ``threading.Event``s (:class:`Pause`), for deterministic interleavings of two actors.
* :class:`WriteFaults` arms a single fault *beneath* a consensus, where its write travels,
  so that the consensus's own read-back logic is what gets tested:
  :class:`StoreWriteFaults` for the object-store log (a store wrapper) and
  :class:`ProxyWriteFaults` for PostgreSQL (a TCP proxy in front of the real server).
"""

from __future__ import annotations

import abc
import contextlib
import random
import socket
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from slatepy.errors import StoreUnavailable
from slatepy.persist.location.consensus import CasResult, Consensus, VersionedData
from slatepy.store.base import ObjectMeta, ObjectStore, PutData, PutMode, WrappingStore
from slatepy.testing.faults import FaultRates, draw_outcome

T = TypeVar("T")
ConsensusOp = Literal["head", "compare_and_set", "scan", "truncate", "list_keys"]
CONSENSUS_OPS: tuple[ConsensusOp, ...] = (
    "head",
    "compare_and_set",
    "scan",
    "truncate",
    "list_keys",
)


def consensus_uniform(rate: float) -> dict[str, FaultRates]:
    """Every consensus call fails with ``rate``, split evenly over the three outcomes."""
    each = FaultRates(rate / 3, rate / 3, rate / 3)
    return dict.fromkeys(CONSENSUS_OPS, each)


class RoutedConsensus(Consensus):
    """A ``Consensus`` wrapper that sends every call of ``inner`` through :meth:`_call`
    (``key`` None for ``list_keys``): the one hook the fault injector and the interceptor
    implement. ``close`` closes ``inner``."""

    inner: Consensus

    @abc.abstractmethod
    def _call(self, op: ConsensusOp, key: str | None, fn: Callable[[], T]) -> T:
        """Run ``fn`` (the call ``op`` on ``key`` of ``inner``) the wrapper's way."""

    def head(self, key: str) -> VersionedData | None:
        return self._call("head", key, lambda: self.inner.head(key))

    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CasResult:
        return self._call(
            "compare_and_set", key, lambda: self.inner.compare_and_set(key, expected, data)
        )

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        return self._call("scan", key, lambda: self.inner.scan(key, from_seqno, limit))

    def truncate(self, key: str, seqno: int) -> int:
        return self._call("truncate", key, lambda: self.inner.truncate(key, seqno))

    def list_keys(self) -> list[str]:
        return self._call("list_keys", None, self.inner.list_keys)

    def close(self) -> None:
        self.inner.close()


@dataclass
class FaultyConsensus(RoutedConsensus):
    """``inner`` behind an unreliable link: per call, from a seeded random source, forward
    it (``ok``), refuse it without acting (``fail``: ``StoreUnavailable(definite=True)``),
    lose it without acting (``timeout``: ``definite=False``), or act and lose the reply
    (``lost_reply``: ``definite=False``; for ``compare_and_set`` the entry *is* written).

    Attributes:
        rates: Fault rates per operation name (see ``CONSENSUS_OPS``); missing: never fails.
        latency: Upper bound of a uniform random delay before each call.
        enabled: Switch faults off (to verify state afterwards) without unwrapping.
        counts: What was injected, as ``"op:outcome"``.
    """

    inner: Consensus
    rates: Mapping[str, FaultRates] = field(default_factory=dict)
    seed: int = 0
    latency: float = 0.0
    enabled: bool = True
    counts: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()

    def _outcome(self, op: str) -> str:
        return draw_outcome(self, op)

    def _call(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        key = key or ""
        outcome = self._outcome(op)
        if outcome == "fail":
            raise StoreUnavailable(f"injected: {op}({key!r}) refused", definite=True)
        if outcome == "timeout":
            raise StoreUnavailable(f"injected: {op}({key!r}) timed out", definite=False)
        result = fn()
        if outcome == "lost_reply":
            raise StoreUnavailable(f"injected: {op}({key!r}) acted, reply lost", definite=False)
        return result


Hook = Callable[[str, str | None], None]
"""``hook(op, key)``; ``key`` is None for ``list_keys``."""


class Pause:
    """One call held at a chosen point: the actor blocks until :meth:`release`.

    ``reached`` is set when the call arrives; the call then waits for the release, at most
    ``timeout`` seconds (a forgotten release fails that call with ``TimeoutError`` instead of
    hanging the test).
    """

    def __init__(self, op: str, key: str | None, when: Literal["before", "after"], timeout: float):
        self.op = op
        self.key = key
        self.when = when
        self.timeout = timeout
        self.reached = threading.Event()
        self._resume = threading.Event()

    def matches(self, op: str, key: str | None, when: str) -> bool:
        return (
            not self.reached.is_set()
            and op == self.op
            and when == self.when
            and (self.key is None or key == self.key)
        )

    def hold(self) -> None:
        self.reached.set()
        if not self._resume.wait(self.timeout):
            raise TimeoutError(f"paused {self.when} {self.op}: nobody released it")

    def wait_reached(self, timeout: float = 30.0) -> None:
        """Block until the paused call has arrived (``TimeoutError`` after ``timeout``)."""
        if not self.reached.wait(timeout):
            raise TimeoutError(f"no {self.op} call reached the pause {self.when} it")

    def release(self) -> None:
        self._resume.set()


class InterceptConsensus(RoutedConsensus):
    """Delegates to ``inner``; runs ``before(op, key)`` / ``after(op, key)`` around every call
    and holds calls that match a :meth:`pause`.

    ``after`` runs once the inner call returned (it acted) and before its caller hears: a
    pause there models a slow reply. A hook may block, act (say, another actor's write) or
    raise (the call fails; raised ``after``, the call acted anyway).
    """

    def __init__(
        self, inner: Consensus, *, before: Hook | None = None, after: Hook | None = None
    ) -> None:
        self.inner = inner
        self.before = before
        self.after = after
        self._pauses: list[Pause] = []
        self._lock = threading.Lock()

    def pause(
        self,
        op: ConsensusOp,
        *,
        key: str | None = None,
        when: Literal["before", "after"] = "before",
        timeout: float = 30.0,
    ) -> Pause:
        """Hold the next ``op`` call (on ``key``, if given) ``before`` or ``after`` it acts."""
        pause = Pause(op, key, when, timeout)
        with self._lock:
            self._pauses.append(pause)
        return pause

    def _at(self, when: Literal["before", "after"], op: str, key: str | None) -> None:
        hook = self.before if when == "before" else self.after
        if hook is not None:
            hook(op, key)
        with self._lock:
            found = next((p for p in self._pauses if p.matches(op, key, when)), None)
            if found is not None:
                self._pauses.remove(found)
        if found is not None:
            found.hold()

    def _call(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        self._at("before", op, key)
        result = fn()
        self._at("after", op, key)
        return result


# One fault beneath a consensus.

WriteOutcome = Literal["fail", "timeout", "lost_reply"]


@dataclass
class _Plan:
    outcome: WriteOutcome
    meanwhile: Callable[[], object] | None
    then_unreachable: bool


class WriteFaults:
    """Arms one fault on the path a consensus's next write takes (see the module docstring).

    The outcomes are those of :mod:`slatepy.testing.faults`: ``fail`` (refused, nothing
    written), ``timeout`` (lost on the way, nothing written), ``lost_reply`` (written, the
    reply lost). ``meanwhile`` runs after the write failed or acted and before the writer
    hears of it: another actor's write slots in exactly there. With ``then_unreachable`` the
    location stops answering (every request fails) until :meth:`heal`, so the writer's
    read-back fails too.
    """

    def __init__(self) -> None:
        self._plan: _Plan | None = None
        self._lock = threading.Lock()
        self.unreachable = False
        self.fired = 0
        self.errors: list[BaseException] = []

    def arm(
        self,
        outcome: WriteOutcome,
        *,
        meanwhile: Callable[[], object] | None = None,
        then_unreachable: bool = False,
    ) -> None:
        with self._lock:
            self._plan = _Plan(outcome, meanwhile, then_unreachable)

    def _take(self) -> _Plan | None:
        with self._lock:
            plan, self._plan = self._plan, None
            if plan is not None:
                self.fired += 1
            return plan

    def _after(self, plan: _Plan) -> None:
        """Run ``meanwhile`` (keeping its error for :meth:`heal`) and go unreachable."""
        if plan.meanwhile is not None:
            try:
                plan.meanwhile()
            except BaseException as exc:  # re-raised in the test by heal()
                self.errors.append(exc)
        if plan.then_unreachable:
            self.unreachable = True

    def heal(self) -> None:
        """Disarm, make the location reachable again, and re-raise an error of ``meanwhile``."""
        with self._lock:
            self._plan = None
            self.unreachable = False
        if self.errors:
            raise self.errors[0]

    def close(self) -> None:
        """Release what the injector holds (threads, sockets)."""


class StoreWriteFaults(WriteFaults, WrappingStore):
    """Object-store faults: the next ``put(mode="create")`` meets the armed outcome; while
    unreachable, every request is refused (``StoreUnavailable(definite=True)``)."""

    def __init__(self, inner: ObjectStore) -> None:
        WriteFaults.__init__(self)
        WrappingStore.__init__(self, inner)

    def _gate(self, what: str) -> None:
        if self.unreachable:
            raise StoreUnavailable(f"injected: the store is unreachable ({what})", definite=True)

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        self._gate(f"PUT {path}")
        plan = self._take() if mode == "create" else None
        if plan is None:
            return self.inner.put(path, data, mode=mode)
        if plan.outcome == "lost_reply":
            self.inner.put(path, data, mode=mode)
        self._after(plan)
        raise StoreUnavailable(
            f"injected: PUT {path} {plan.outcome}",
            path=path,
            definite=plan.outcome == "fail",
        )

    def get(self, path: str) -> bytes:
        self._gate(f"GET {path}")
        return self.inner.get(path)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        self._gate(f"GET {path}")
        return self.inner.get_range(path, start, end)

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self._gate(f"GET {path}")
        return self.inner.get_ranges(path, ranges)

    def get_suffix(self, path: str, length: int) -> bytes:
        self._gate(f"GET {path}")
        return self.inner.get_suffix(path, length)

    def head(self, path: str) -> ObjectMeta:
        self._gate(f"HEAD {path}")
        return self.inner.head(path)

    def delete(self, path: str) -> None:
        self._gate(f"DELETE {path}")
        self.inner.delete(path)

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        self._gate(f"LIST {prefix}")
        return self.inner.list(prefix, offset=offset)

    def copy(self, source: str, destination: str) -> None:
        self._gate(f"COPY {source}")
        self.inner.copy(source, destination)


READY_FOR_QUERY = b"Z\x00\x00\x00\x05"
"""The frame PostgreSQL ends every reply with (then one status byte): once a reply ends
with it, the statement before it has run and, in autocommit, committed."""


class ProxyWriteFaults(WriteFaults):
    """PostgreSQL faults: a TCP proxy on 127.0.0.1 in front of ``upstream``; connect the
    consensus to :attr:`port` instead of the server's.

    The armed fault hits the next request the client sends (arm it right before the
    ``compare_and_set``, on a consensus that has already connected): ``fail`` and
    ``timeout`` cut the connection without forwarding the statement; ``lost_reply``
    forwards it, waits for the complete reply (the statement committed), and cuts the
    connection instead of delivering it. While unreachable, new connections are closed as
    soon as they are accepted. The proxy only looks for the end of a reply; it speaks no
    protocol.
    """

    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1") -> None:
        super().__init__()
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="pg-fault-proxy", daemon=True
        )
        self._accept_thread.start()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.unreachable:
                client.close()
                continue
            try:
                server = socket.create_connection(self._upstream, timeout=10)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            server.settimeout(None)
            with self._lock:
                self._sockets.update((client, server))
            link = _Link(self, client, server)
            for target in (link.client_to_server, link.server_to_client):
                thread = threading.Thread(target=target, daemon=True, name="pg-fault-pump")
                thread.start()
                self._threads.append(thread)

    def _forget(self, *socks: socket.socket) -> None:
        for sock in socks:
            with self._lock:
                self._sockets.discard(sock)
            with contextlib.suppress(OSError):  # already disconnected
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._stopping.set()
        self._listener.close()
        self._accept_thread.join(timeout=5)
        with self._lock:
            socks = list(self._sockets)
        self._forget(*socks)
        for thread in self._threads:
            thread.join(timeout=5)


class _Link:
    """One proxied connection: two pumps, and the fault that may cut it."""

    def __init__(self, proxy: ProxyWriteFaults, client: socket.socket, server: socket.socket):
        self.proxy = proxy
        self.client = client
        self.server = server
        self.held_reply: _Plan | None = None
        self.reply = bytearray()

    def _cut(self, plan: _Plan) -> None:
        self.proxy._after(plan)
        self.proxy._forget(self.client, self.server)

    def client_to_server(self) -> None:
        try:
            while chunk := self.client.recv(65536):
                plan = self.proxy._take()
                if plan is None:
                    self.server.sendall(chunk)
                elif plan.outcome == "lost_reply":
                    self.held_reply = plan
                    self.server.sendall(chunk)
                else:
                    self._cut(plan)
                    return
        except OSError:
            pass  # the other pump or close() cut the connection
        self.proxy._forget(self.client, self.server)

    def server_to_client(self) -> None:
        try:
            while chunk := self.server.recv(65536):
                plan = self.held_reply
                if plan is None:
                    self.client.sendall(chunk)
                    continue
                self.reply += chunk
                if self.reply[-6:-1] == READY_FOR_QUERY:
                    self._cut(plan)
                    return
        except OSError:
            pass
        self.proxy._forget(self.client, self.server)
