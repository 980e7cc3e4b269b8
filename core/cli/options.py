"""Options and arguments several commands share, and loading the configuration they name."""

from __future__ import annotations

import datetime as dt
import os
import sys
import warnings

import click

from mqstore.cli.app import BadInput
from mqstore.config import StoreConfig, load_config
from mqstore.plugin_api.manager import check_config
from mqstore.errors import ConfigError
from mqstore.ops.store_files import store_marks

json_option = click.option("--json", "as_json", is_flag=True, default=False,
                           help="Print JSON (for scripts) instead of tables.")
config_option = click.option("-c", "--config", "config_path", default=None,
                             type=click.Path(exists=True, dir_okay=False),
                             help="YAML configuration (default: the built-in defaults).")


def store_dir(root: str) -> str:
    """``root`` when it is a store directory (``store_files.store_marks``); else bad input
    naming it, one line, exit 2: a command that reads a store reads nothing else, and writes
    nothing (consumer offsets, membership files) into a directory that is not one."""
    if not os.path.isdir(root):
        raise BadInput(f"store directory {root!r} does not exist" if not os.path.exists(root)
                       else f"{root!r} is not a directory")
    if not store_marks(root):
        raise BadInput(f"{root!r} is not a store directory: it has no mqstore.json, "
                       f"commitlog/, consumequeue/ or checkpoint (mqstore init makes a store)")
    return root


def new_or_store_dir(root: str) -> str:
    """``root`` for a command that writes a store, creating it where there is none: a store,
    a missing or empty directory; a directory holding other files is refused as
    ``store_dir`` refuses it (``mqstore init`` makes a store there on purpose)."""
    if os.path.isdir(root) and os.listdir(root) and not store_marks(root):
        return store_dir(root)
    if os.path.exists(root) and not os.path.isdir(root):
        raise BadInput(f"{root!r} is not a directory")
    return root


existing_root = click.argument("root", type=click.Path(),
                               callback=lambda _ctx, _param, root: store_dir(root))


def server_options(command, via: str = "with the official RocketMQ client"):
    """``--server HOST:PORT`` and the credentials a served store's gRPC endpoint checks;
    ``via``: how the command goes through the endpoint."""
    for option in reversed((
            click.option("--server", default=None, metavar="HOST:PORT",
                         help=f"Go through the gRPC endpoint of a running `mqstore serve` "
                              f"(server.grpc_listen) {via}, instead of opening a store "
                              f"directory; needs the grpc extra."),
            click.option("--access-key", envvar="MQSTORE_ACCESS_KEY", default="",
                         show_envvar=True, help="With --server: the client's access key."),
            click.option("--secret-key", envvar="MQSTORE_SECRET_KEY", default="",
                         show_envvar=True, help="With --server: the access key's secret key "
                                                "(better given in the environment)."))):
        command = option(command)
    return command


def admin_server_options(command):
    """``--server HOST:PORT`` and the admin credentials a served store's admin service checks
    (``server.grpc_admin_keys``: client keys are not admins). The old ``--access-key`` and
    ``--secret-key`` of these commands still work for a release, with a DeprecationWarning."""
    for option in reversed((
            click.option("--server", default=None, metavar="HOST:PORT",
                         help="Go through the gRPC endpoint of a running `mqstore serve` "
                              "(server.grpc_listen) and its admin service, instead of opening "
                              "a store directory; needs the grpc extra."),
            click.option("--admin-access-key", "access_key", envvar="MQSTORE_ADMIN_ACCESS_KEY",
                         default="", show_envvar=True,
                         help="With --server: an admin access key of the endpoint "
                              "(server.grpc_admin_keys)."),
            click.option("--admin-secret-key", "secret_key", envvar="MQSTORE_ADMIN_SECRET_KEY",
                         default="", show_envvar=True,
                         help="With --server: the admin access key's secret key (better "
                              "given in the environment)."),
            click.option("--access-key", "old_access_key", default=None, hidden=True,
                         callback=_renamed_option("--admin-access-key")),
            click.option("--secret-key", "old_secret_key", default=None, hidden=True,
                         callback=_renamed_option("--admin-secret-key")))):
        command = option(command)
    return command


def _renamed_option(new: str):
    def callback(_ctx, param, value):
        if value is not None:
            with warnings.catch_warnings():  # shown as a renamed configuration key is
                if not sys.warnoptions:
                    warnings.simplefilter("default", DeprecationWarning)
                warnings.warn(f"option {param.opts[0]} of the topic and group commands is now "
                              f"{new} (an admin key: server.grpc_admin_keys)",
                              DeprecationWarning, stacklevel=2)
        return value
    return callback


def admin_credentials(access_key: str, secret_key: str, old_access_key: str | None,
                      old_secret_key: str | None) -> tuple[str, str]:
    """The admin credentials given, the old option names standing in for the new."""
    return (access_key or old_access_key or "", secret_key or old_secret_key or "")


def load_cli_config(path: str | None, param: str = "'-c' / '--config'",
                    **overrides) -> StoreConfig:
    """The configuration at ``path`` (or the defaults) with ``overrides``; a bad one is a
    usage error naming the option."""
    try:
        config = load_config(path, overrides=overrides or None)
        # The names it picks among plugins too, before any command touches a directory.
        check_config(config, f"{path or 'defaults'}{' + overrides' if overrides else ''}")
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint=param) from None
    return config


def short_lived(config: StoreConfig) -> StoreConfig:
    """For a command that opens a store for moments: its loops run as threads (the same
    code and files, without starting worker processes for one open)."""
    return config.replace(dispatch={"worker": "thread"}, flush={"worker": "thread"})


def epoch_ms(value: str) -> int:
    """A time given on the command line, in epoch milliseconds: digits are epoch ms already;
    anything else must be an ISO-8601 time (local time when it names no zone), parsed by
    ``datetime.fromisoformat``; ValueError otherwise. Before 1970 is negative."""
    if value.isascii() and value.isdigit():
        return int(value)
    try:
        return int(dt.datetime.fromisoformat(value).timestamp() * 1000)
    except (OverflowError, OSError) as exc:  # a year the platform's time functions refuse
        raise ValueError(str(exc)) from None
