"""The CLI's conventions in one place, for every command (docs/cli-conventions.md).

- **Escaping**: keys and values print as text by one reversible rule (``escape``): valid
  UTF-8 that is printable stays as it is; a backslash, tab, newline and carriage return
  become ``\\\\``, ``\\t``, ``\\n``, ``\\r``; every other byte (control bytes, bytes that are
  not UTF-8, unprintable characters) becomes ``\\xNN`` per byte. Output therefore has one
  record per line and tab-separated fields, and ``unescape`` (the type of ``--start`` and
  ``--end``) turns the printed form back into the exact bytes. ``--json`` uses the same
  escaped text for keys and values.
- **Exit codes**: ``OK`` 0, ``FAILED`` 1 (refused or failed), ``USAGE`` 2 (argparse's own),
  ``INTERRUPTED`` 130 (SIGINT), ``TERMINATED`` 143 (SIGTERM).
- **Argument types** that validate before anything runs (a bad value is a usage error).
- **Locations**: a plain path is accepted wherever a URL is (``location``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

OK = 0
FAILED = 1
USAGE = 2
INTERRUPTED = 130
TERMINATED = 143

_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_UNESCAPES = {"\\": b"\\", "t": b"\t", "n": b"\n", "r": b"\r"}
_TOKEN = re.compile(r"\\x([0-9a-fA-F]{2})|\\(.)|([^\\]+)|(\\)$", re.DOTALL)


def escape(data: bytes) -> str:
    """``data`` as one line of text, reversible by ``unescape`` (see the module docstring)."""
    out: list[str] = []
    text = data.decode("utf-8", "surrogateescape")
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        else:
            out.extend(f"\\x{b:02x}" for b in char.encode("utf-8", "surrogateescape"))
    return "".join(out)


def unescape(text: str) -> bytes:
    """The bytes ``escape`` printed as ``text``; also an argparse type (``--start``).

    Raw bytes in the command line that are not UTF-8 (Python passes them as surrogate
    escapes) are taken as they are.

    Raises:
        argparse.ArgumentTypeError: an unknown or incomplete backslash escape (a usage error).
    """
    out = bytearray()
    for match in _TOKEN.finditer(text):
        hex_byte, escaped, plain, trailing = match.groups()
        if hex_byte is not None:
            out.append(int(hex_byte, 16))
        elif plain is not None:
            out += plain.encode("utf-8", "surrogateescape")
        elif escaped is not None and escaped in _UNESCAPES:
            out += _UNESCAPES[escaped]
        else:
            bad = "\\" if trailing else f"\\{escaped}"
            raise argparse.ArgumentTypeError(
                f"{text!r}: unknown escape {bad!r} (use \\\\, \\t, \\n, \\r or \\xNN)"
            )
    return bytes(out)


def location(text: str) -> str:
    """A URL as given, or a plain path as its ``file://`` URL (as ``Db.open(Path)`` does)."""
    if "://" in text:
        return text
    return Path(text).resolve().as_uri()


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is less than 0")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number of seconds, at least 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text} is not a finite number >= 0")
    return value


def fraction(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text} is more than 1")
    return value


def add_json(parser: argparse.ArgumentParser, help: str = "print the report as JSON") -> None:
    """Give ``parser`` the ``--json`` flag every reporting command has."""
    parser.add_argument("--json", action="store_true", help=help)


def print_json(value: Any, *, lines: bool = False) -> None:
    """Print ``value`` as JSON: indented, or one compact object per line (``lines``) for
    streams a script reads as it comes. Non-JSON values (datetimes, paths) print as text."""
    if lines:
        print(json.dumps(value, default=str, ensure_ascii=False), flush=True)
    else:
        print(json.dumps(value, default=str, indent=2, ensure_ascii=False))


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where SIGINT would be so that the same clean-up runs (a lease is
    handed back); ``main`` exits ``TERMINATED`` instead of ``INTERRUPTED``."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def exit_on_sigterm() -> None:
    """For long-running commands: SIGTERM stops them like Ctrl-C, exit status 143."""
    signal.signal(signal.SIGTERM, _terminate)


def silence_stdout() -> None:
    """After ``BrokenPipeError`` (``slatepy wal tail URL | head -1``): point standard output
    at ``os.devnull`` so that the interpreter's final flush does not fail again (as the Python
    documentation on SIGPIPE recommends). A no-op where stdout is not a file descriptor."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
