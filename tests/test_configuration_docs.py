"""docs/configuration.md's examples run, in order, and print what the page shows: each
``python`` block is executed in one namespace, each ``sh`` block by ``bash`` in the same
directory, and a ``text`` block right after one is its expected output."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def _blocks() -> list[tuple[str, str, str | None]]:
    """``(language, code, expected output or None)`` for each runnable block."""
    found = [(m.group(1), m.group(2)) for m in _BLOCK.finditer(DOC.read_text())]
    runnable: list[tuple[str, str, str | None]] = []
    for i, (language, code) in enumerate(found):
        if language in ("python", "sh"):
            after = found[i + 1] if i + 1 < len(found) else None
            expected = after[1] if after is not None and after[0] == "text" else None
            runnable.append((language, code, expected))
    return runnable


def test_the_configuration_page_runs_as_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if (name.startswith("SLATEPY_") and not name.startswith("SLATEPY_TEST_")) or (
            name.startswith(("AWS_", "GOOGLE_"))
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.chdir(tmp_path)
    # The page's shell commands use the `slatepy` of this interpreter and this checkout.
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ.get("PATH", ""))
    root = str(DOC.parent.parent)
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))

    blocks = _blocks()
    assert [language for language, _, _ in blocks].count("python") >= 4
    namespace: dict[str, object] = {"__name__": "docs_configuration"}
    for language, code, expected in blocks:
        if language == "python":
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, str(DOC), "exec"), namespace)
            printed = out.getvalue()
        else:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", code],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, f"{code}\n{done.stderr}"
            printed = done.stdout
        if expected is not None:
            assert printed == expected, f"{code}\nprinted {printed!r}, the page shows {expected!r}"
