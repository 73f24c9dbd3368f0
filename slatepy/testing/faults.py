"""A store that fails on purpose: the four outcomes of an unreliable network call.

Per call, from a seeded random source, ``FaultyStore`` either

* ``ok``: forwards the call;
* ``fail``: raises ``StoreUnavailable(definite=True)`` without acting (a refused request);
* ``timeout``: raises ``StoreUnavailable(definite=False)`` without acting (the request was
  lost on the way);
* ``lost_reply``: forwards the call, then raises ``StoreUnavailable(definite=False)`` (the
  request acted, its reply was lost) -- the case that makes CAS outcomes uncertain.

Rates are per operation kind (``get`` covers every read, ``put``, ``delete``, ``list``,
``copy``, ``head``); ``latency`` adds a uniform random delay. ``counts`` records what was
injected. Faults can be switched off (``enabled = False``) to verify state afterwards.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from slatepy.errors import StoreUnavailable
from slatepy.store.base import ObjectMeta, ObjectStore, PutData, PutMode, WrappingStore

T = TypeVar("T")
OUTCOMES = ("fail", "timeout", "lost_reply")


@dataclass(frozen=True, slots=True)
class FaultRates:
    """Probability of each failing outcome for one operation kind (the rest succeeds)."""

    fail: float = 0.0
    timeout: float = 0.0
    lost_reply: float = 0.0

    def __post_init__(self) -> None:
        if min(self.fail, self.timeout, self.lost_reply) < 0 or self.total > 1:
            raise ValueError(f"fault rates must be >= 0 and sum to <= 1: {self}")

    @property
    def total(self) -> float:
        return self.fail + self.timeout + self.lost_reply


def uniform(rate: float) -> dict[str, FaultRates]:
    """Every operation kind fails with ``rate``, split evenly over the three outcomes."""
    each = FaultRates(rate / 3, rate / 3, rate / 3)
    return dict.fromkeys(("get", "put", "delete", "list", "copy", "head"), each)


class _Injector(Protocol):
    """What :func:`draw_outcome` needs of a fault injector."""

    rates: Mapping[str, FaultRates]
    latency: float
    enabled: bool
    counts: Counter[str]
    _rng: random.Random
    _lock: threading.Lock


def draw_outcome(injector: _Injector, kind: str) -> str:
    """Draw the outcome of one ``kind`` call (``ok`` or one of :data:`OUTCOMES`) from the
    injector's seeded source, after its random latency, and count what was injected."""
    rates = injector.rates.get(kind)
    with injector._lock:
        roll = injector._rng.random()
        delay = injector._rng.uniform(0, injector.latency) if injector.latency else 0.0
    if delay:
        time.sleep(delay)
    if not injector.enabled or rates is None:
        return "ok"
    for outcome in OUTCOMES:
        roll -= getattr(rates, outcome)
        if roll < 0:
            with injector._lock:
                injector.counts[f"{kind}:{outcome}"] += 1
            return outcome
    return "ok"


@dataclass
class FaultyStore(WrappingStore):
    """``inner`` behind an unreliable network (see the module docstring)."""

    inner: ObjectStore
    rates: Mapping[str, FaultRates] = field(default_factory=dict)
    seed: int = 0
    latency: float = 0.0
    enabled: bool = True
    counts: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()

    def _outcome(self, kind: str) -> str:
        return draw_outcome(self, kind)

    def _call(self, kind: str, path: str, fn: Callable[[], T]) -> T:
        outcome = self._outcome(kind)
        if outcome == "fail":
            raise StoreUnavailable(f"injected: {kind} {path} refused", path=path, definite=True)
        if outcome == "timeout":
            raise StoreUnavailable(f"injected: {kind} {path} timed out", path=path, definite=False)
        result = fn()
        if outcome == "lost_reply":
            raise StoreUnavailable(
                f"injected: {kind} {path} acted, reply lost", path=path, definite=False
            )
        return result

    def get(self, path: str) -> bytes:
        return self._call("get", path, lambda: self.inner.get(path))

    def get_range(self, path: str, start: int, end: int) -> bytes:
        return self._call("get", path, lambda: self.inner.get_range(path, start, end))

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return self._call("get", path, lambda: self.inner.get_ranges(path, ranges))

    def get_suffix(self, path: str, length: int) -> bytes:
        return self._call("get", path, lambda: self.inner.get_suffix(path, length))

    def head(self, path: str) -> ObjectMeta:
        return self._call("head", path, lambda: self.inner.head(path))

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        return self._call("put", path, lambda: self.inner.put(path, data, mode=mode))

    def delete(self, path: str) -> None:
        self._call("delete", path, lambda: self.inner.delete(path))

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        return self._call("list", prefix, lambda: self.inner.list(prefix, offset=offset))

    def copy(self, source: str, destination: str) -> None:
        self._call("copy", source, lambda: self.inner.copy(source, destination))
