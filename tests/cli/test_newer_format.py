"""A manifest written by a newer slatepy (format version above the newest this one reads) is
reported as "upgrade slatepy", never as damage, and ``doctor --repair`` refuses to fall back
past it (issue 33 review: an older slatepy's repair would give up the newer manifests and
what they published, after which GC could delete SSTs only they named)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy import Db
from slatepy.errors import CorruptionError, UnsupportedFormatVersion
from slatepy.format.checksum import checksum
from slatepy.format.envelope import seal, unseal
from slatepy.format.sst import decode_sst
from slatepy.format.sst_index import FOOTER, FOOTER_CHECKSUM, FOOTER_SIZE, SUPPORTED_VERSIONS
from slatepy.manifest import Manifest, ManifestStore
from slatepy.manifest.record import MANIFEST_FORMAT_VERSION, MANIFEST_MAGIC
from slatepy.store import open_store
from tests.cli.test_doctor import Capture, run
from tests.engine.damaged import (
    OFF,
    compact,
    key,
    listing,
    manifest_path,
    only_compacted,
    put_all,
    wal_path,
)

NEWER = MANIFEST_FORMAT_VERSION + 1
NEWER_SST = max(SUPPORTED_VERSIONS) + 1


def newer_database(root: Path) -> tuple[str, int]:
    """A database whose newest manifest a newer slatepy wrote (after a compaction by this
    one); returns its URL and that manifest's id."""
    url = f"file://{root}"
    put_all(url, {key(i): b"v%d" % i for i in range(4)})
    compact(url)
    manifests = ManifestStore(open_store(url))
    stored = manifests.load()
    assert stored is not None and stored.manifest.l0
    # What a future format would hold is unknown; only its envelope's version matters.
    payload = stored.manifest.encode()[6:-8]
    assert manifests.objects.create(stored.id + 1, seal(MANIFEST_MAGIC, NEWER, payload)) is None
    return url, stored.id + 1


def test_the_newer_manifest_raises_the_typed_error_naming_it(tmp_path: Path) -> None:
    url, newest = newer_database(tmp_path / "db")
    with pytest.raises(UnsupportedFormatVersion) as caught:
        ManifestStore(open_store(url)).load()
    message = str(caught.value)
    assert manifest_path(newest) in message and caught.value.path == manifest_path(newest)
    assert f"format version {NEWER}" in message
    assert f"reads up to {MANIFEST_FORMAT_VERSION}" in message
    assert "written by a newer slatepy; upgrade" in message
    assert not isinstance(caught.value, CorruptionError)  # no "run slatepy doctor"
    with pytest.raises(UnsupportedFormatVersion):
        Db.open(url, settings=OFF)


def test_verify_and_doctor_say_upgrade_not_damage(tmp_path: Path, capsys: Capture) -> None:
    root = tmp_path / "db"
    url, newest = newer_database(root)
    before = listing(root)
    upgrade = (
        f"{manifest_path(newest)}: written by a newer slatepy (format {NEWER}; this one "
        f"reads up to {MANIFEST_FORMAT_VERSION}): upgrade slatepy"
    )

    status, out = run(capsys, "inspect", url, "--verify")
    assert status == 1
    assert upgrade in out
    assert "bad object" not in out and "damaged" not in out

    status, out = run(capsys, "doctor", url)
    assert status == 1
    assert upgrade in out and "no repair" in out
    assert "and give up:" not in out and "damaged" not in out  # no repair plan
    assert listing(root) == before


def test_doctor_repair_refuses_to_fall_back_past_it_and_writes_nothing(
    tmp_path: Path, capsys: Capture
) -> None:
    root = tmp_path / "db"
    url, _ = newer_database(root)
    before = listing(root)
    status, out = run(capsys, "doctor", url, "--repair")
    assert status == 1
    assert "UnsupportedFormatVersion" in out and "upgrade slatepy" in out
    assert "repaired" not in out
    assert listing(root) == before  # nothing written, nothing deleted


def test_every_envelope_says_upgrade_for_a_newer_version_and_damage_for_an_unknown_older() -> None:
    # Persist rollups, diffs and batches share the envelope: the same typed error.
    with pytest.raises(UnsupportedFormatVersion, match="persist rollup: format version 3"):
        unseal(seal(b"SLPR", 3, b""), b"SLPR", (1, 2), "persist rollup")
    with pytest.raises(CorruptionError, match="unsupported format version 0"):
        unseal(seal(b"SLPR", 0, b""), b"SLPR", (1, 2), "persist rollup")


def test_inspect_shows_the_version_a_manifest_is_stored_as(tmp_path: Path, capsys: Capture) -> None:
    from tests.manifest.test_manifest_versions import as_version_1

    url = f"file://{tmp_path / 'db'}"
    put_all(url, {key(0): b"v"})
    manifests = ManifestStore(open_store(url))
    stored = manifests.load()
    assert stored is not None
    assert manifests.objects.create(stored.id + 1, as_version_1(stored.manifest)) is None
    status, out = run(capsys, "inspect", url)
    assert status == 0 and f"manifest {stored.id + 1} (format 1)" in out
    old = Manifest.decode(as_version_1(stored.manifest))
    assert old.format_version == 1
    # The next update writes (and says) the current version.
    assert int.from_bytes(old.encode()[4:6], "little") == MANIFEST_FORMAT_VERSION
    assert Manifest.decode(old.encode()).format_version == MANIFEST_FORMAT_VERSION
    with Db.open(url, settings=OFF):
        pass
    status, out = run(capsys, "inspect", url)
    assert status == 0 and f"(format {MANIFEST_FORMAT_VERSION})" in out


def as_newer_sst(path: Path) -> None:
    """Make the SST at ``path`` claim the next SST format version (an intact footer)."""
    data = bytearray(path.read_bytes())
    fields = list(FOOTER.unpack_from(data, len(data) - FOOTER_SIZE))
    fields[1] = NEWER_SST
    footer = FOOTER.pack(*fields)
    data[-FOOTER_SIZE:] = footer + FOOTER_CHECKSUM.pack(checksum(footer))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["wal", "compacted"])
def test_an_sst_of_a_newer_format_is_no_damage_and_no_repair_gives_it_up(
    tmp_path: Path, capsys: Capture, kind: str
) -> None:
    # A newer writer's WAL SST after the manifest's compacted prefix (or a newer compactor's
    # output under a manifest this slatepy reads): a repair would cut the WAL there (or drop
    # the SST), giving up acknowledged writes.
    root = tmp_path / "db"
    url = f"file://{root}"
    put_all(url, {key(i): b"v%d" % i for i in range(3)})
    if kind == "compacted":
        compact(url)
        newer = only_compacted(root)
    else:
        newer = wal_path(3)
    as_newer_sst(root / newer)
    with pytest.raises(UnsupportedFormatVersion, match=f"SST: format version {NEWER_SST}"):
        decode_sst((root / newer).read_bytes())
    before = listing(root)
    upgrade = (
        f"{newer}: written by a newer slatepy (format {NEWER_SST}; this one reads up to "
        f"{max(SUPPORTED_VERSIONS)}): upgrade slatepy"
    )

    status, out = run(capsys, "inspect", url, "--verify")
    assert status == 1 and upgrade in out and "bad object" not in out

    status, out = run(capsys, "doctor", url)
    assert status == 1 and upgrade in out and "no repair" in out and "and give up:" not in out

    status, out = run(capsys, "doctor", url, "--repair")
    assert status == 1 and "UnsupportedFormatVersion" in out and newer in out
    assert listing(root) == before


def test_a_read_of_a_newer_compacted_sst_names_it(tmp_path: Path) -> None:
    root = tmp_path / "db"
    url = f"file://{root}"
    put_all(url, {key(i): b"v%d" % i for i in range(3)})
    compact(url)
    newer = only_compacted(root)
    as_newer_sst(root / newer)
    with Db.open(url, settings=OFF) as db, pytest.raises(UnsupportedFormatVersion) as caught:
        db.get(key(0))
    assert caught.value.path == newer and newer in str(caught.value)
