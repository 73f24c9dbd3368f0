"""``open_catalog``/``open_storage`` take the store's settings as ``settings=``, like
``PersistClient.open`` (issue 32 item 1); ``store_settings=`` is a deprecated alias."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy.catalog import open_catalog
from slatepy.catalog.open import open_storage
from slatepy.config import Settings
from slatepy.errors import InvalidArgument


def test_settings_is_the_keyword_and_takes_a_dict(tmp_path: Path) -> None:
    """Before: ``settings=`` was an unexpected keyword (a ``TypeError``)."""
    url = f"file://{tmp_path}/catalog"
    with open_catalog(url, settings={"store_timeout": 5.0}) as state:
        state.open()
        assert state.settings() == {}
    storage = open_storage(url, settings={"reader_lease": 120.0})
    try:  # a persist tunable in the dict reaches the client
        assert storage._client.settings.reader_lease == 120.0  # type: ignore[attr-defined]
    finally:
        storage.close()
    with pytest.raises(InvalidArgument, match="did you mean 'flush_interval'"):
        open_catalog(url, settings={"flush_intreval": 1})


def test_store_settings_is_a_deprecated_alias(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/catalog"
    with pytest.warns(DeprecationWarning, match="pass settings="):
        state = open_catalog(url, store_settings=Settings())
    with state:
        state.open()
    with pytest.warns(DeprecationWarning, match="open_storage"):
        open_storage(url, store_settings=Settings()).close()
    with pytest.raises(InvalidArgument, match="not both"):
        open_catalog(url, settings={}, store_settings=Settings())
