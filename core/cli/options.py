"""Options and arguments several commands share, and loading the configuration they name."""

from __future__ import annotations

import datetime as dt

import click

from mqstore.config import StoreConfig, load_config
from mqstore.errors import ConfigError

json_option = click.option("--json", "as_json", is_flag=True, default=False,
                           help="Print JSON (for scripts) instead of tables.")
config_option = click.option("-c", "--config", "config_path", default=None,
                             type=click.Path(exists=True, dir_okay=False),
                             help="YAML configuration (default: the built-in defaults).")
existing_root = click.argument("root", type=click.Path(exists=True, file_okay=False))


def server_options(command):
    """``--server HOST:PORT`` and the credentials a served store's gRPC endpoint checks."""
    for option in reversed((
            click.option("--server", default=None, metavar="HOST:PORT",
                         help="Go through the gRPC endpoint of a running `mqstore serve` "
                              "(server.grpc_listen) with the official RocketMQ client, "
                              "instead of opening a store directory; needs the grpc extra."),
            click.option("--access-key", envvar="MQSTORE_ACCESS_KEY", default="",
                         show_envvar=True, help="With --server: the client's access key."),
            click.option("--secret-key", envvar="MQSTORE_SECRET_KEY", default="",
                         show_envvar=True, help="With --server: the access key's secret key "
                                                "(better given in the environment)."))):
        command = option(command)
    return command


def load_cli_config(path: str | None, param: str = "'-c' / '--config'",
                    **overrides) -> StoreConfig:
    """The configuration at ``path`` (or the defaults) with ``overrides``; a bad one is a
    usage error naming the option."""
    try:
        return load_config(path, overrides=overrides or None)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint=param) from None


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
