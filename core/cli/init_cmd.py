"""``mqstore init DIR [-c config.yaml]``: create a store with its settings recorded."""

from __future__ import annotations

import os

import click

from mqstore.cli import output
from mqstore.cli.options import config_option, json_option, load_cli_config, short_lived
from mqstore.errors import StoreLockedError
from mqstore.ops.store_files import store_marks
from mqstore.storage.meta_file import read_meta
from mqstore.storage.store_lock import holder
from mqstore.store import MessageStore


@click.command("init")
@click.argument("root", type=click.Path(file_okay=False))
@config_option
@json_option
def init(root: str, config_path: str | None, as_json: bool) -> None:
    """Create a store in ROOT (made if missing, else it must hold no store).

    The string hash and file sizes the configuration gives are recorded in ROOT/mqstore.json;
    later configurations never change them for this store.
    """
    config = load_cli_config(config_path)
    writer = holder(root)
    if writer is not None:  # however few of its files are left
        raise StoreLockedError(f"mqstore init: store {root!r} is {writer}; nothing was changed")
    if os.path.isdir(root):
        held = store_marks(root)
        if held:
            raise click.ClickException(f"{root!r} already holds a store ({', '.join(held)})")
    with MessageStore.open(root, config=short_lived(config)):
        pass
    meta = read_meta(root) or {}
    result = {"root": os.path.abspath(root), **meta}
    if as_json:
        output.emit_json(result)
    else:
        output.print_fields(result, title="store created")
