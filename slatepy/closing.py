"""The context-manager protocol shared by every handle with a ``close()``: the engine's
``Db``, ``DbReader`` and ``WalReader``, persist's client and handles."""

from __future__ import annotations

import abc
import contextlib
from types import TracebackType
from typing import Self


class Closing(abc.ABC):
    """``with x: ...`` closes ``x``; when the block raised, a failing close stays quiet
    (the exception propagating says what went wrong)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        with contextlib.suppress(Exception):
            self.close()
