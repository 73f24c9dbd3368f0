"""Every example in README.md and docs/*.md (not docs/rfcs) runs, and prints what the page
shows.

Per page, in one temporary directory and in order: each ``python`` block is executed in one
namespace; each ``bash``/``sh`` block by ``bash``; each ``console`` block's ``$ `` lines by
``bash``, its other lines being the expected output. A ``text`` block right after a block that
runs is that block's expected output. In Python, a line ``expr  # -> value`` checks that
``expr == value``. In expected output, ``…`` (or ``...``) matches anything within a line, and
a line of only ``…`` matches any number of lines.

Blocks naming ``s3://bucket/`` run with ``SLATEPY_S3_*`` pointing at the session's moto
server (bucket ``bucket``), and blocks naming ``az://container/`` with
``SLATEPY_AZURE_ENDPOINT`` at the session's Azurite (container ``container``); where Node.js
or Azurite is missing, those blocks are skipped, saying why, after the page's other blocks
ran. A block that cannot run is preceded by ``<!-- not run: reason -->``
(the reason is required).
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from slatepy.testing.azurite import create_container
from slatepy.testing.moto import create_bucket

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = ("python", "bash", "sh", "console")
_FENCE = re.compile(r"^```(\w*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not run(?::\s*(.*?))?\s*-->$")
_ARROW = re.compile(r"^(\s*)(.+?)\s*# -> (.+)$")


@dataclass
class Block:
    language: str
    code: str
    line: int
    excuse: str | None  # None: runs; "": marked but without a reason
    expected: str | None = None


def _blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, each with the ``not run`` comment before it, if any."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marked = _NOT_RUN.match(lines[before].strip()) if before >= 0 else None
        excuse = None if marked is None else (marked.group(1) or "")
        code = "\n".join(body) + "\n"
        block = Block(fence.group(1), code, start + 1, excuse)
        if block.language == "text" and blocks and blocks[-1].expected is None:
            prior = blocks[-1]
            if prior.language in RUNNABLE and prior.excuse is None and prior.line + 1 < start:
                # Only a text block directly after the runnable one (blank lines allowed).
                between = lines[prior.line + prior.code.count("\n") + 1 : start]
                if not any(line.strip() for line in between):
                    prior.expected = code
                    continue
        blocks.append(block)
    return blocks


def _with_checks(code: str) -> str:
    """Turn ``expr  # -> value`` lines into checks of ``expr == value``."""
    out = []
    for number, line in enumerate(code.splitlines(), 1):
        arrow = _ARROW.match(line)
        if arrow is not None:
            indent, expr, value = arrow.groups()
            check = f"{indent}__check__(({expr}), ({value}), {number})"
            ast.parse(check.strip())  # a `# ->` line must be one expression
            out.append(check)
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _check(actual: object, expected: object, line: int) -> None:
    shown = f"line {line} of the block: got {actual!r}, the page shows {expected!r}"
    assert actual == expected, shown


def _matches(printed: str, expected: str) -> bool:
    parts = []
    for line in expected.rstrip("\n").split("\n"):
        if line.strip() in ("…", "..."):
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            pieces = re.split(r"…|\.\.\.", line)
            parts.append("[^\n]*".join(re.escape(p) for p in pieces) + r"\n")
    return re.fullmatch("".join(parts), printed.rstrip("\n") + "\n") is not None


def _console_script(code: str) -> tuple[str, str]:
    """A console block's commands (``$ `` lines and their ``\\`` continuations) and output."""
    commands: list[str] = []
    output: list[str] = []
    continuing = False
    for line in code.splitlines():
        if continuing or line.startswith("$ "):
            commands.append(line if continuing else line[2:])
            continuing = line.endswith("\\")
        else:
            output.append(line)
    return "\n".join(commands) + "\n", "\n".join(output) + "\n" if output else ""


def _isolate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if (name.startswith("SLATEPY_") and not name.startswith("SLATEPY_TEST_")) or (
            name.startswith(("AWS_", "GOOGLE_", "AZURE_"))
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.chdir(tmp_path)
    # Shell commands use the `slatepy` of this interpreter and this checkout.
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_every_page_is_collected() -> None:
    names = {page.name for page in PAGES}
    assert {"README.md", "configuration.md", "engine.md", "operations.md"} <= names
    # The parser finds the blocks (as tests/test_configuration_docs.py used to check).
    configuration = _blocks(ROOT / "docs" / "configuration.md")
    assert [block.language for block in configuration].count("python") >= 4
    assert sum(block.expected is not None for block in configuration) >= 4


def test_the_readme_test_command_is_what_ci_runs() -> None:
    """``.ci/run`` runs the README's test command verbatim; neither may drift."""
    command = (
        "python3 -m venv .venv && "
        '.venv/bin/pip install -e ".[dev,spark]" && .venv/bin/python -m pytest'
    )
    assert command in (ROOT / "README.md").read_text().splitlines()
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_block_that_cannot_run_says_why(page: Path) -> None:
    for block in _blocks(page):
        where = f"{page.name}:{block.line}"
        assert block.excuse != "", f"{where}: `not run` needs a reason"
        # Anything else would be skipped silently: name the language, or mark it `text`.
        known = (*RUNNABLE, "text", "toml", "json")
        assert block.language in known, f"{where}: ```{block.language}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_page_runs_as_shown(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    _isolate(tmp_path, monkeypatch)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}", "__check__": _check}
    skipped: list[str] = []
    for block in _blocks(page):
        if block.language not in RUNNABLE or block.excuse is not None:
            continue
        where = f"{page.name}:{block.line}"
        with monkeypatch.context() as env:
            if "s3://bucket/" in block.code:
                endpoint = request.getfixturevalue("s3_endpoint")
                with contextlib.suppress(Exception):  # already there from an earlier page
                    create_bucket(endpoint, "bucket")
                env.setenv("SLATEPY_S3_ENDPOINT", endpoint.url)
                env.setenv("SLATEPY_S3_REGION", endpoint.region)
                env.setenv("SLATEPY_S3_ACCESS_KEY_ID", endpoint.access_key_id)
                env.setenv("SLATEPY_S3_SECRET_ACCESS_KEY", endpoint.secret_access_key)
                env.setenv("SLATEPY_S3_ALLOW_HTTP", "true")
            if "az://container/" in block.code:
                try:
                    azurite = request.getfixturevalue("azure_endpoint")
                except pytest.skip.Exception as missing:  # no Node.js or Azurite here
                    skipped.append(f"{where}: {missing}")
                    continue
                with contextlib.suppress(Exception):  # already there from an earlier page
                    create_container(azurite, "container")
                env.setenv("SLATEPY_AZURE_ENDPOINT", azurite.url)
            expected = block.expected
            if block.language == "python":
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    exec(compile(_with_checks(block.code), where, "exec"), namespace)
                printed = out.getvalue()
            else:
                script = block.code
                if block.language == "console":
                    script, shown = _console_script(block.code)
                    expected = shown or expected
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", script],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                assert done.returncode == 0, f"{where}\n{script}\n{done.stderr}"
                printed = done.stdout
        if expected is not None:
            assert _matches(printed, expected), (
                f"{where}: printed\n{printed}\nthe page shows\n{expected}"
            )
    if skipped:
        pytest.skip("every other block ran; skipped " + "; ".join(skipped))


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_reaches_its_page_and_heading(page: Path) -> None:
    for target in _LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target} does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{page.name}: no heading for {target}"
