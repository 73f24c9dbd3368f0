"""Issue 32 item 4: slatepy's type hints reach a user's mypy after ``pip install -e .``.

setuptools' default editable install is an import-hook finder that type checkers cannot
follow (mypy: "Cannot find implementation or library stub for module named 'slatepy'");
``package-dir = {"" = "."}`` in pyproject.toml makes it a plain path entry (a ``.pth`` line),
as a wheel install is a plain directory. The test builds that layout: an empty venv whose
site-packages holds a ``.pth`` naming this checkout, then runs mypy on a user file.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
USER = """\
import asyncio
from slatepy import Db, Settings, aio

db = Db.open("memory://", settings=Settings(flush_interval=0.05))
value: bytes | None = db.get(b"k")
keys: list[bytes] = list(db.keys())
reveal_type(db)
bad: int = db.get(b"k")


async def main() -> None:
    async with aio.Db.open("memory://") as adb:
        async for key, val in adb.scan():
            reveal_type(key)
"""


def test_pyproject_asks_for_a_plain_path_editable_install() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"": "."}
    assert "py.typed" in config["package-data"]["slatepy"]
    assert (ROOT / "slatepy" / "py.typed").exists()


def test_mypy_sees_slatepy_hints_through_a_path_entry(tmp_path: Path) -> None:
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    purelib = sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)})
    Path(purelib, "__editable__.slatepy.pth").write_text(f"{ROOT}\n")
    (tmp_path / "user.py").write_text(USER)
    python = env / "bin" / "python"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--python-executable",
            str(python),
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            "user.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout
    assert "import-not-found" not in out and "missing library stubs" not in out, out
    assert 'Revealed type is "slatepy.engine.db.Db"' in out, out
    assert 'Revealed type is "bytes"' in out or '"builtins.bytes"' in out, out
    assert 'Incompatible types in assignment (expression has type "bytes | None"' in out, out
