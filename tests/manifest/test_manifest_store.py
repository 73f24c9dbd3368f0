"""The numbered manifest store: bootstrap, CAS conflicts, concurrent updaters."""

from __future__ import annotations

import threading

import msgspec
import pytest

from slatepy.errors import CorruptionError, ManifestConflictError
from slatepy.manifest import Manifest, ManifestStore
from slatepy.testing.intercept import InterceptStore
from tests.conftest import Backend


def bump_compactor(manifest: Manifest, _next: int) -> Manifest:
    return msgspec.structs.replace(manifest, compactor_epoch=manifest.compactor_epoch + 1)


def test_first_update_creates_manifest_one(backend: Backend) -> None:
    manifests = ManifestStore(backend.store())
    assert manifests.load() is None
    stored = manifests.update(bump_compactor)
    assert stored.id == 1 and stored.manifest.compactor_epoch == 1
    assert ManifestStore(backend.store()).objects.ids() == [1]
    assert ManifestStore(backend.store()).load() == stored


def test_update_returning_none_writes_nothing(backend: Backend) -> None:
    manifests = ManifestStore(backend.store())
    manifests.update(bump_compactor)
    assert manifests.update(lambda m, _: None).id == 1
    assert ManifestStore(backend.store()).objects.ids() == [1]


def test_lost_cas_reapplies_on_the_new_latest(backend: Backend) -> None:
    """Another process writes ``next`` between our read and our write: we redo on top."""
    store = backend.store()
    other = ManifestStore(store)
    other.update(bump_compactor)
    raced = False

    def before_put(path: str) -> None:
        nonlocal raced
        if not raced:
            raced = True
            other.update(bump_compactor)  # takes manifest 2 first

    ours = ManifestStore(InterceptStore(store, before_put))
    stored = ours.update(bump_compactor)
    assert stored.id == 3 and stored.manifest.compactor_epoch == 3


def test_concurrent_updaters_never_lose_an_update(backend: Backend) -> None:
    threads, per_thread = 4, 5
    errors: list[BaseException] = []

    def work() -> None:
        manifests = ManifestStore(backend.store())
        try:
            for _ in range(per_thread):
                manifests.update(bump_compactor)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=60)
    assert not errors
    final = ManifestStore(backend.store()).load()
    assert final is not None
    assert final.id == threads * per_thread
    assert final.manifest.compactor_epoch == threads * per_thread


def test_update_gives_up_after_the_attempt_budget(backend: Backend) -> None:
    store = backend.store()
    rival = ManifestStore(store)
    rival.update(bump_compactor)
    ours = ManifestStore(InterceptStore(store, lambda _p: rival.update(bump_compactor)), attempts=3)
    with pytest.raises(ManifestConflictError):
        ours.update(bump_compactor)


def test_a_corrupt_latest_manifest_is_reported(backend: Backend) -> None:
    store = backend.store()
    manifests = ManifestStore(store)
    manifests.update(bump_compactor)
    store.put(manifests.path(2), b"garbage that is not a manifest")
    with pytest.raises(CorruptionError):
        ManifestStore(store).load()
