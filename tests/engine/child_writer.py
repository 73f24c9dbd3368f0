"""A writer process for crash and race tests (run as ``python -m tests.engine.child_writer``).

Argument: a JSON object with ``url``, ``settings``, ``mode`` and mode parameters. Every line
printed to stdout is flushed at once so a parent that SIGKILLs us has seen every
acknowledgement we made:

* ``OPEN <epoch>`` once the writer is open.
* ``ACK <key> <value>`` after a write of ``key`` = ``value`` was acknowledged as durable.
* ``FENCED`` / ``ALIVE`` at the end of a race run.
"""

from __future__ import annotations

import json
import random
import sys
import time

from slatepy import Db, FencedError, Settings, WriteBatch


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def crash_workload(db: Db, rng: random.Random, base: int, keys: int) -> None:
    """Write forever (until killed): durable puts, batches, and unawaited writes + flush."""
    counter = base
    pending: list[tuple[bytes, bytes]] = []
    while True:
        counter += 1
        choice = rng.random()
        key = b"key%03d" % rng.randrange(keys)
        value = b"%s:%d" % (key, counter)
        if choice < 0.4:
            db.put(key, value)
            emit(f"ACK {key.decode()} {value.decode()}")
        elif choice < 0.6:
            batch = WriteBatch()
            written = {}
            for _ in range(3):
                counter += 1
                k = b"key%03d" % rng.randrange(keys)
                v = b"%s:%d" % (k, counter)
                batch.put(k, v)
                written[k] = v
            db.write(batch)
            for k, v in written.items():
                emit(f"ACK {k.decode()} {v.decode()}")
        elif choice < 0.9:
            db.put(key, value, await_durable=False)
            pending.append((key, value))
        else:
            db.flush()
            for k, v in pending:
                emit(f"ACK {k.decode()} {v.decode()}")
            pending.clear()


def race_workload(db: Db, tag: str, deadline: float) -> None:
    i = 0
    try:
        while time.time() < deadline:
            key = f"{tag}-{i:06d}"
            db.put(key.encode(), tag.encode())
            emit(f"ACK {key} {tag}")
            i += 1
    except FencedError:
        emit("FENCED")
        return
    emit("ALIVE")


def main() -> None:
    config = json.loads(sys.argv[1])
    settings = Settings.from_dict(config["settings"])
    # Racers open together (at a wall-clock instant the parent chose) and write until a
    # common deadline, so their writing overlaps however slowly each process started.
    time.sleep(max(0.0, config.get("start_at", 0) - time.time()))
    try:
        db = Db.open(config["url"], settings=settings)
    except FencedError:
        emit("FENCED")
        return
    emit(f"OPEN {db.epoch}")
    if config["mode"] == "crash":
        crash_workload(db, random.Random(config["seed"]), config["base"], config["keys"])
    else:
        race_workload(db, config["tag"], config["start_at"] + config["seconds"])
        db.close()


if __name__ == "__main__":
    main()
