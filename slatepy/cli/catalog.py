"""``slatepy catalog``: inspect and repair a durable catalog at any catalog URL (RFC 0028 §7).

``init`` creates a catalog (or says it exists); ``dump`` prints it as JSON whose keys and
values can be edited and passed back to ``edit`` and ``delete``; ``epoch`` prints the epoch;
``upgrade-check`` says whether this code could open it (never writes; exit code 0 or 1).
``edit`` and ``delete`` commit at the current upper without bumping the epoch, retrying
while other writers win, and append an audit event; a running leader is fenced by them, so
they warn when the catalog has one and they changed something. Bad JSON, an unknown
collection, a value that does not fit its collection or a missing catalog exit 1 with one
line, before anything is written or created.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from slatepy.catalog import CatalogState, Transaction, UninitializedCatalog, open_catalog
from slatepy.catalog.errors import InvalidCatalogObject
from slatepy.catalog.objects import collection, redact
from slatepy.cli.output import location, print_json
from slatepy.config import Settings
from slatepy.errors import InvalidArgument, NotFound

USER = "slatepy catalog"
"""The audit log's user for the tool's edits."""


def add_catalog_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``slatepy catalog ...`` on the top-level subparsers."""
    catalog = sub.add_parser("catalog", help="the durable catalog: inspect and repair it")
    csub = catalog.add_subparsers(dest="catalog_command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        parser = csub.add_parser(name, help=help)
        parser.add_argument(
            "url",
            type=location,
            help="sqlite:////abs/path.db, postgresql://..., or a persist location (a URL, or "
            "a plain directory path)",
        )
        parser.add_argument("--shard", default="catalog", help="persist shard / SQL prefix")
        parser.add_argument(
            "--consensus", default=None, help="persist only: a postgresql:// consensus URL"
        )
        parser.add_argument(
            "--json", action="store_true", help="print the result as JSON (dump: always)"
        )
        return parser

    command("init", "create the catalog (nothing if it exists)")
    dump = command("dump", "the catalog as JSON (keys and values editable)")
    dump.add_argument("--target", type=Path, default=None, help="write here, not to stdout")
    dump.add_argument(
        "--ignore-large-collections",
        action="store_true",
        help="leave out audit_log and storage_usage",
    )
    command("epoch", "the epoch of the catalog's newest opener")
    edit = command("edit", "set one object (prints the previous value)")
    edit.add_argument("collection", help="the collection of the object")
    edit.add_argument("key", help="the key as JSON, as dump prints it")
    edit.add_argument("value", help="the new value as JSON")
    delete = command("delete", "delete one object (prints the previous value)")
    delete.add_argument("collection", help="the collection of the object")
    delete.add_argument("key", help="the key as JSON, as dump prints it")
    command("upgrade-check", "could this code open (and migrate) the catalog? never writes")


def _json(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{what} is not JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a JSON object: {text!r}")
    return value


def run_catalog(args: argparse.Namespace, settings: Settings) -> int:
    """Run one ``slatepy catalog`` command; errors propagate as ``SlatepyError``."""
    command = args.catalog_command
    key = value = None
    if command in ("edit", "delete"):  # every check that needs no catalog comes first
        coll = collection(args.collection)
        if coll.append_only:
            raise InvalidCatalogObject(f"collection {coll.name!r} is append-only: no edits")
        key = _json(args.key, "the key")
        key_bytes = coll.key_bytes(key)
        if command == "edit":
            value = _json(args.value, "the value")
            coll.check_size(key_bytes, coll.value_bytes(value))
    try:
        state = open_catalog(
            args.url,
            shard=args.shard,
            consensus=args.consensus,
            settings=settings,
            create=command == "init",
            user=USER,
        )
    except NotFound:
        raise UninitializedCatalog(f"no catalog at {args.url} (nothing is there)") from None
    with state:
        if command == "init":
            return _init(state, as_json=args.json)
        if command == "upgrade-check":
            found, code = state.check_open()
            if found == 0:
                raise UninitializedCatalog(f"no catalog at {state.description} to upgrade")
            if args.json:
                print_json({"from_version": found, "to_version": code, "would_succeed": True})
            else:
                print(f"catalog upgrade from version {found} to {code} would succeed")
            return 0
        if command == "dump":  # one read, which raises when there is no catalog
            text = state.dump(ignore_large_collections=args.ignore_large_collections)
            pretty = json.dumps(json.loads(text), indent=2) + "\n"
            if args.target is None:
                sys.stdout.write(pretty)
            else:
                try:
                    args.target.write_text(pretty)
                except OSError as exc:
                    raise InvalidArgument(f"--target {args.target}: {exc.strerror}") from None
            return 0
        contents = state.current()  # raises when there is no catalog
        if command == "epoch":
            if args.json:
                print_json({"epoch": contents.epoch})
            else:
                print(f"Epoch: {contents.epoch}")
        else:
            name = args.collection

            def apply(tx: Transaction) -> dict[str, Any] | None:
                return tx.set(name, key, value) if command == "edit" else tx.delete(name, key)

            try:
                previous = state.debug_commit(apply, user=USER)
            finally:  # also when the edit failed after its fencing write landed
                if contents.epoch and state.debug_wrote:  # only then is a leader fenced
                    print(
                        f"warning: the catalog was last opened (epoch {contents.epoch}) by "
                        f"{contents.holder or 'an unknown process'}; a leader still running "
                        "there is fenced by this change",
                        file=sys.stderr,
                    )
            if args.json:
                print_json({"previous": redact(previous)})
            else:
                print(f"previous value: {json.dumps(redact(previous))}")
    return 0


def _init(state: CatalogState, *, as_json: bool) -> int:
    """Create the catalog, or say it exists (also when a concurrent init created it first:
    ``initialize`` writes only at upper 0). Both are done: exit 0."""
    if not state.initialize():
        found, code = state.check_open()
        if as_json:
            print_json({"created": False, "version": found, "code_version": code})
        else:
            print(f"catalog {state.description} exists (version {found}; this code: {code})")
        return 0
    if as_json:
        print_json({"created": True, "epoch": state.epoch})
    else:
        print(f"catalog {state.description} initialized (epoch {state.epoch})")
    return 0
