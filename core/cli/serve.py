"""``mqstore serve -c config.yaml [--root DIR]``: run a deployment from one YAML file."""

from __future__ import annotations

import logging

import click

from mqstore.cli.options import load_cli_config, new_or_store_dir
from mqstore.ops.server import serve as run_deployment

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@click.command()
@click.option("-c", "--config", "config_path", required=True,
              type=click.Path(exists=True, dir_okay=False),
              help="The deployment's YAML configuration (with its server section).")
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="Store directory (default: store.root in the configuration).")
@click.option("-v", "--verbose", is_flag=True, default=False,
              help="Log at debug level, whatever server.log_level says.")
@click.pass_context
def serve(ctx: click.Context, config_path: str, root: str | None, verbose: bool) -> None:
    """Open the store with its worker processes and cleanup, serve Prometheus metrics at
    /metrics and a health check at /healthz on server.metrics_listen, with server.grpc_listen
    RocketMQ 5's gRPC API for the official clients (docs/endpoint.md), and log what it does,
    until SIGTERM or SIGINT: then end the gRPC calls, flush, stop the workers and close
    cleanly.

    Exit status 0 after a clean close, 1 when the store could not close cleanly.
    """
    config = load_cli_config(config_path)
    root = root or config.store.root
    if not root:
        raise click.UsageError("no store directory: pass --root or set store.root in the "
                               "configuration")
    new_or_store_dir(root)
    level = logging.DEBUG if verbose else getattr(logging, config.server.log_level.upper())
    logging.basicConfig(level=level, format=LOG_FORMAT, force=True)
    ctx.exit(0 if run_deployment(root, config) else 1)
