"""One mechanism for the asyncio facade of every handle (``slatepy.aio``, ``slatepy.persist.aio``).

An async twin is a :class:`Facade` subclass that names the sync class it wraps
(``class Db(ClosingFacade[SyncDb], wraps=SyncDb)``) and declares each member once, from the
sync member itself, so the signature, result type and docstring come from there (``help()``,
``inspect.signature`` and mypy see them):

- ``put = in_thread(SyncDb.put)``: awaitable, runs on a worker thread (``asyncio.to_thread``);
- ``snapshot = in_thread_as(Snapshot, SyncDb.snapshot)``: the same, the result wrapped in its
  async twin (handles returning handles);
- ``begin = plain_as(Transaction, SyncDb.begin)`` / ``plain(...)``: no I/O, not awaitable;
- ``scan = rows(SyncDb.scan, batch_size)``: a :class:`Rows`, awaitable and async-iterable;
- ``url = attribute(SyncDb.url)``: a read-only property read from the sync handle.

The sync member is looked up on ``self.sync`` at each call, so a subclass's override runs.
:func:`missing_twins` lists the public members of the wrapped class a twin lacks (minus the
ones it declares ``unmirrored``, each with its reason): ``tests/test_facade.py`` keeps every
twin complete. RFC 0033 records the choice.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import operator
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator, Mapping
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    overload,
)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
A = TypeVar("A")
S = TypeVar("S")
Row = TypeVar("Row", bound=tuple[Any, ...])
"""A scan's row: ``(key, value)``, or ``(key, value, expire_at_ms)``."""

_DOC = ("__name__", "__qualname__", "__doc__")


class Facade(Generic[S]):
    """The async twin of a sync handle ``self.sync``: its ``repr`` is ``aio.`` and the sync
    one's. Subclasses name the class they wrap (``wraps=``) and the public members they leave
    out on purpose (``unmirrored={name: why}``)."""

    wraps: ClassVar[type | None] = None
    unmirrored: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(
        cls, *, wraps: type | None = None, unmirrored: Mapping[str, str] | None = None
    ) -> None:
        """Record the wrapped sync class and the members left out on purpose."""
        super().__init_subclass__()
        if wraps is not None:
            cls.wraps = wraps
            cls.unmirrored = dict(unmirrored or {})

    def __init__(self, sync: S) -> None:
        """Wrap an open sync handle."""
        self.sync = sync

    def __repr__(self) -> str:
        """``aio.`` and the sync handle's repr."""
        return f"aio.{self.sync!r}"


class _SyncExits(Protocol):
    def __exit__(self, exc_type: Any, exc: Any, tb: Any, /) -> None: ...


class _SyncCloses(_SyncExits, Protocol):
    def close(self) -> None: ...


E = TypeVar("E", bound=_SyncExits)
C = TypeVar("C", bound=_SyncCloses)


class ExitingFacade(Facade[E]):
    """A twin whose ``async with`` is the sync handle's ``with`` on a worker thread (a
    transaction commits or rolls back; a handle closes, quietly if the block raised)."""

    async def __aenter__(self) -> Self:
        """``async with`` the handle: the handle itself."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """The sync ``__exit__`` on a worker thread."""
        await asyncio.to_thread(self.sync.__exit__, exc_type, exc, tb)


class ClosingFacade(ExitingFacade[C]):
    """A twin of a handle with ``close()``: ``await handle.close()`` or ``async with``."""

    async def close(self) -> None:
        """Close the handle (the sync ``close``, on a worker thread)."""
        await asyncio.to_thread(self.sync.close)


def in_thread(
    method: Callable[Concatenate[Any, P], R],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """An async method running the sync method of the same name on a worker thread, with
    its parameters, result type and docstring."""
    name = method.__name__

    async def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(getattr(self.sync, name), *args, **kwargs)

    functools.update_wrapper(call, method, assigned=_DOC, updated=())
    return call


def in_thread_as(
    twin: Callable[[R], A], method: Callable[Concatenate[Any, P], R]
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, A]]:
    """:func:`in_thread`, the result (a sync handle) wrapped in its async ``twin``."""
    name = method.__name__

    async def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> A:
        return twin(await asyncio.to_thread(getattr(self.sync, name), *args, **kwargs))

    functools.update_wrapper(call, method, assigned=_DOC, updated=())
    return call


def plain(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """A plain method calling the sync one of the same name (it does no I/O)."""
    name = method.__name__

    def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = getattr(self.sync, name)(*args, **kwargs)
        return result

    functools.update_wrapper(call, method, assigned=_DOC, updated=())
    return call


def plain_as(
    twin: Callable[[R], A], method: Callable[Concatenate[Any, P], R]
) -> Callable[Concatenate[Any, P], A]:
    """:func:`plain`, the result (a sync handle) wrapped in its async ``twin``."""
    name = method.__name__

    def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> A:
        return twin(getattr(self.sync, name)(*args, **kwargs))

    functools.update_wrapper(call, method, assigned=_DOC, updated=())
    return call


class Rows(Generic[Row]):
    """A scan: ``await`` it for one list, or ``async for`` it for rows fetched a batch per
    worker-thread hop (the event loop never waits on the store)."""

    def __init__(self, rows: Callable[[], Iterator[Row]], batch_size: int) -> None:
        """``rows`` makes the sync scan (on a worker thread: taking the view may do I/O)."""
        self._rows = rows
        self._batch_size = batch_size

    def __await__(self) -> Generator[Any, None, list[Row]]:
        """``await db.scan()``: every row, as one list (one worker-thread hop)."""
        return asyncio.to_thread(lambda: list(self._rows())).__await__()

    async def __aiter__(self) -> AsyncIterator[Row]:
        """``async for key, value in db.scan()``: a batch of rows per worker-thread hop."""
        rows: Iterator[Row] = await asyncio.to_thread(self._rows)
        size = self._batch_size
        try:
            while batch := await asyncio.to_thread(lambda: list(itertools.islice(rows, size))):
                for row in batch:
                    yield row
        finally:
            close = getattr(rows, "close", None)
            if close is not None:
                await asyncio.to_thread(close)


def rows(
    method: Callable[Concatenate[Any, P], Iterator[Row]], batch_size: int
) -> Callable[Concatenate[Any, P], Rows[Row]]:
    """A method returning :class:`Rows` over the sync iterator method of the same name (made
    on a worker thread when first awaited or iterated)."""
    name = method.__name__

    def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> Rows[Row]:
        sync = getattr(self.sync, name)
        return Rows(lambda: sync(*args, **kwargs), batch_size)

    functools.update_wrapper(call, method, assigned=_DOC, updated=())
    call.__doc__ = (
        f"{method.__doc__ or ''}\n\nAsync: ``await`` it for one list of ``(key, value)``, or "
        "``async for`` over it (a batch of rows per worker-thread hop)."
    )
    return call


class Attribute(property, Generic[T]):
    """A read-only property forwarding to the sync handle's attribute of the same name (no
    I/O, not awaitable); typed ``T`` for mypy."""

    def __init__(self, name: str, doc: str | None) -> None:
        """Forward ``name``; ``doc`` is the sync attribute's."""
        super().__init__(operator.attrgetter(f"sync.{name}"))  # C-level: as fast as property
        self.__doc__ = doc  # a property subclass keeps its doc in the instance dict

    if TYPE_CHECKING:  # the types only: at run time property.__get__ runs, unwrapped

        @overload
        def __get__(self, obj: None, owner: type | None = None) -> Self: ...
        @overload
        def __get__(self, obj: object, owner: type | None = None) -> T: ...
        def __get__(self, obj: object, owner: type | None = None) -> Any: ...


def attribute(getter: Callable[[Any], T], doc: str | None = None) -> Attribute[T]:
    """:class:`Attribute` of a sync property (``attribute(SyncDb.url)``), documented by the
    sync property's docstring or, where it has none, by ``doc``."""
    fget = getattr(getter, "fget", getter)
    return Attribute(fget.__name__, fget.__doc__ or doc)


def missing_twins(facade: type[Facade[Any]]) -> list[str]:
    """The public members of ``facade.wraps`` that ``facade`` lacks and does not declare
    ``unmirrored``, and the ``unmirrored`` names the sync class no longer has."""
    sync = facade.wraps
    assert sync is not None, f"{facade.__name__} names no wrapped class"
    public = {name for name in dir(sync) if not name.startswith("_")}
    missing = sorted(
        f"{facade.__name__}.{name}"
        for name in public
        if name not in facade.unmirrored and not hasattr(facade, name)
    )
    stale = sorted(f"{facade.__name__}.{name} (stale)" for name in set(facade.unmirrored) - public)
    return missing + stale


def facades() -> list[type[Facade[Any]]]:
    """Every :class:`Facade` subclass that names a wrapped class (imported so far)."""
    found: list[type[Facade[Any]]] = []
    todo: list[type[Facade[Any]]] = [Facade]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.wraps is not None and cls not in found:
            found.append(cls)
    return found
