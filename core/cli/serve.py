"""``mqstore serve -c config.yaml [--root DIR]``: run a deployment from one YAML file."""

from __future__ import annotations

import logging

import click

from mqstore.cli.options import load_cli_config, new_or_store_dir
from mqstore.config import load_config
from mqstore.ops.server import serve as run_deployment
from mqstore.runtime.log_format import formatter


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
    cleanly. SIGHUP reads the configuration file again and takes what changes without a
    restart (the log level, the access keys, the connection limits), logging what it took and
    what needs a restart.

    Exit status 0 after a clean close, 1 when the store could not close cleanly.
    """
    config = load_cli_config(config_path)
    root = root or config.store.root
    if not root:
        raise click.UsageError("no store directory: pass --root or set store.root in the "
                               "configuration")
    new_or_store_dir(root)
    level = logging.DEBUG if verbose else getattr(logging, config.server.log_level.upper())
    handler = logging.StreamHandler()  # stderr, which the worker processes write to as well
    handler.setFormatter(formatter(config.server.log_format))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    clean = run_deployment(root, config, reread=lambda: load_config(config_path),
                           debug=verbose)
    ctx.exit(0 if clean else 1)
