"""A reader process for cross-process tests (``python -m tests.engine.child_reader CONFIG``).

CONFIG is JSON with ``url`` and ``settings``. Prints ``OPEN <manifest_id>`` once open, then
answers one command per stdin line, one line each:

* ``WAIT <key> <value> <timeout>`` -> ``SEEN <seconds>`` once ``get(key) == value``, else
  ``TIMEOUT``; seconds count from when the command arrived.
* ``SCAN`` -> ``SCAN <keys> <distinct values>`` from one ``scan()``.
* ``VIEW`` -> ``VIEW <compacted SST ids the reader's view uses>``.
* ``CLOSE`` -> ``CLOSED`` after closing the reader.
"""

from __future__ import annotations

import json
import sys
import time

from slatepy import DbReader, Settings
from slatepy.engine.view import compacted_ids


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    config = json.loads(sys.argv[1])
    reader = DbReader.open(config["url"], settings=Settings.from_dict(config["settings"]))
    emit(f"OPEN {reader.manifest_id}")
    for line in sys.stdin:
        command, *args = line.split()
        if command == "WAIT":
            key, value, timeout = args[0].encode(), args[1].encode(), float(args[2])
            start = time.monotonic()
            while reader.get(key) != value and time.monotonic() - start < timeout:
                time.sleep(0.002)
            seen = reader.get(key) == value
            emit(f"SEEN {time.monotonic() - start:.4f}" if seen else "TIMEOUT")
        elif command == "SCAN":
            items = dict(reader.scan())
            emit(f"SCAN {len(items)} {len(set(items.values()))}")
        elif command == "VIEW":
            emit("VIEW " + " ".join(sorted(compacted_ids(reader.view))))
        elif command == "CLOSE":
            reader.close()
            emit("CLOSED")
            return


if __name__ == "__main__":
    main()
