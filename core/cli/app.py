"""The ``mqstore`` command group: every command, and how failures reach the terminal.

Exit codes follow the CLI convention: 0 success, 1 failure (or, for ``check``, problems
found), 2 bad usage or input. A failure is printed as one line, ``Error: ...``; tracebacks
are for bugs only.
"""

from __future__ import annotations

import logging
import sys
import warnings

import click

from mqstore.errors import CorruptRecordError, CorruptStateError, MQStoreError

# Errors that are ValueErrors (for callers that skip what does not decode) but say the data on
# disk is damaged, not that the input was bad: failures, exit 1.
DAMAGED_DATA = (CorruptRecordError, CorruptStateError)


class BadInput(click.ClickException):
    """Input the store refused as invalid (a topic name, a key): a usage error, exit 2."""

    exit_code = 2


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class MqstoreGroup(click.Group):
    """Turns the store's errors into one-line click errors with the conventional codes."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except DAMAGED_DATA as exc:  # damaged data, not bad input
            raise click.ClickException(_one_line(exc)) from None
        except ValueError as exc:
            # The store's argument checks name the value and the rule; bad input whatever
            # else it is (ConfigError, a filter's syntax error: store errors too).
            raise BadInput(_one_line(exc)) from None
        except (MQStoreError, OSError, TimeoutError, PermissionError) as exc:
            raise click.ClickException(_one_line(exc)) from None


@click.group(cls=MqstoreGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mqstore")
def main() -> None:
    """mqstore: an embedded message store with RocketMQ-compatible files."""
    # The store's warnings (damage found, files repaired) as one line each on stderr.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # A renamed key in the deployment's YAML is the operator's to fix: shown unless warnings
    # were set otherwise (-W, PYTHONWARNINGS), and like every warning as one line.
    if not sys.warnoptions:
        warnings.filterwarnings("default", message="configuration key ",
                                category=DeprecationWarning)
    warnings.showwarning = _warning_line


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    logging.getLogger("mqstore").warning("%s: %s", category.__name__, message)


def _register() -> None:
    from mqstore.cli import (
        bench, check, consume, demo, group, info, init_cmd, inspect_cmd, produce, query, role,
        serve, stats, topic,
    )
    from mqstore.cli import export_cmd  # imports mqstore.spark only when it runs
    for command in (init_cmd.init, produce.produce, consume.consume, query.query,
                    inspect_cmd.inspect, check.check, stats.stats, topic.topic, group.group,
                    role.role, serve.serve, bench.bench, demo.demo, info.info):
        main.add_command(command)
    main.add_command(export_cmd.export)


_register()
