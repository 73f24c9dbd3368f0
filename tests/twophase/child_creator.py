"""A process racing to create ``race/{i}`` for i < N through the two-phase CAS.

``python -m tests.twophase.child_creator URL SETTINGS_JSON TAG N`` prints ``WIN i`` or
``LOSE i`` per destination.
"""

from __future__ import annotations

import json
import sys

from slatepy import Settings
from slatepy.store import open_store
from slatepy.store.cas import create_if_absent


def main() -> None:
    url, settings_json, tag, count = sys.argv[1:5]
    store = open_store(url, Settings.from_dict(json.loads(settings_json)))
    for i in range(int(count)):
        lost = create_if_absent(store, f"race/{i}", tag.encode() * 100)
        print(f"{'LOSE' if lost is not None else 'WIN'} {i}", flush=True)


if __name__ == "__main__":
    main()
