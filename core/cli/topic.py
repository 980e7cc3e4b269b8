"""``mqstore topic create|update|list|delete DIR ...``: topic configs, as ``mqadmin`` manages
a broker's (``config/topics.json``; docs/topics.md); with ``--server HOST:PORT`` those of the
store a running ``mqstore serve`` holds open, through its gRPC endpoint."""

from __future__ import annotations

import functools

import click

from mqstore.cli import output
from mqstore.cli.options import (
    admin_credentials, admin_server_options, config_option, json_option, load_cli_config,
    store_dir,
)
from mqstore.ops.admin import StoreAdmin
from mqstore.format.names import is_system_topic

COUNT = click.IntRange(1, 65_536)
PERM = click.Choice(["2", "4", "6"])
FIELDS = ("read_queues", "write_queues", "perm", "perm_text")




def admin_target(*names: str):
    """The arguments of a topic or group command: ROOT, a store directory, then ``names``; or,
    with --server HOST:PORT, ``names`` alone. The command is called with what it works
    through first (``admin``), then its ``names``: the single place a --server path branches.
    The command declares ``config_option`` and ``admin_server_options``."""
    def decorate(command):
        @functools.wraps(command)
        def run(root, config_path, server, access_key, secret_key, old_access_key,
                old_secret_key, **kwargs):
            access_key, secret_key = admin_credentials(access_key, secret_key, old_access_key,
                                                       old_secret_key)
            given = [v for v in (root, *(kwargs.pop(n) for n in names)) if v is not None]
            if server is None:
                wanted = ["ROOT", *map(str.upper, names)]
                if not given:
                    raise click.UsageError("give ROOT, a store directory, or --server "
                                           "HOST:PORT")
                if len(given) < len(wanted):
                    raise click.UsageError(f"Missing argument '{wanted[len(given)]}'.")
                admin = StoreAdmin(store_dir(given[0]), load_cli_config(config_path))
                return command(admin, *given[1:], **kwargs)
            if len(given) > len(names) or config_path is not None:
                raise click.UsageError("ROOT and --config apply to a store directory, not to "
                                       "--server (the served store's configuration applies)")
            if len(given) < len(names):
                raise click.UsageError(f"Missing argument '{names[len(given)].upper()}'.")
            return command(_served(server, access_key, secret_key), *given, **kwargs)

        for name in reversed(names):
            run = click.argument(name, required=False, metavar=name.upper())(run)
        return click.argument("root", required=False, type=click.Path(),
                              metavar="[ROOT]")(run)
    return decorate


def _served(server: str, access_key: str, secret_key: str):
    try:
        from mqstore.endpoint.admin_client import AdminClient
    except ImportError as exc:
        raise click.ClickException(f"--server needs the grpc extra ({exc})") from None
    try:
        return AdminClient(server, access_key, secret_key)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--server'") from None


def _queue_options(command):
    for option in reversed((
            click.option("-q", "--queues", type=COUNT, default=None,
                         help="Read and write queues (default for create: "
                              "queue_select.queues_per_topic)."),
            click.option("-r", "--read-queues", type=COUNT, default=None,
                         help="Read queues (RocketMQ's readQueueNums), overriding --queues."),
            click.option("-w", "--write-queues", type=COUNT, default=None,
                         help="Write queues (writeQueueNums): puts pick among queue ids "
                              "0..N-1 and a higher one is refused."),
    )):
        command = option(command)
    return command


@click.group()
def topic() -> None:
    """Create, change, list and delete the topic configs of a store (config/topics.json,
    RocketMQ's format), as mqadmin updateTopic, topicList and deleteTopic do."""


@topic.command("create")
@admin_target("name")
@_queue_options
@click.option("-p", "--perm", type=PERM, default="6", show_default=True,
              help="2 write only, 4 read only, 6 read and write.")
@config_option
@admin_server_options
@json_option
def create(admin, name: str, queues: int | None, read_queues: int | None,
           write_queues: int | None, perm: str, as_json: bool) -> None:
    """Create topic NAME in the store in ROOT, or with --server in the store a running
    `mqstore serve` holds open.

    Works on a closed store and beside a running writer, which follows within a second
    (through --server at once). The first config a store records also lists the topics it
    already holds.
    """
    result = admin.topic_create(name, queues=queues, read_queues=read_queues,
                                write_queues=write_queues, perm=int(perm))
    if as_json:
        output.emit_json(result)
    else:
        output.print_fields(result, title="topic created")


@topic.command("update")
@admin_target("name")
@_queue_options
@click.option("-p", "--perm", type=PERM, default=None,
              help="2 write only, 4 read only, 6 read and write.")
@config_option
@admin_server_options
@json_option
def update(admin, name: str, queues: int | None, read_queues: int | None,
           write_queues: int | None, perm: str | None, as_json: bool) -> None:
    """Change topic NAME's queue counts or permission (what is not given stays).

    Works on a closed store and beside a running writer, which follows within a second
    (through --server at once). Fewer write queues stop puts to the queues past them; their
    messages stay readable.
    """
    if queues is None and read_queues is None and write_queues is None and perm is None:
        raise click.UsageError("nothing to change: give --queues, --read-queues, "
                               "--write-queues or --perm")
    result = admin.topic_update(
        name, queues=queues, read_queues=read_queues, write_queues=write_queues,
        perm=None if perm is None else int(perm))
    if as_json:
        output.emit_json(result)
        return
    before = result["before"]
    output.print_table(("field", "before", "after"),
                       [(f, before[f], result[f]) for f in FIELDS], title=f"topic {name} updated")


@topic.command("list")
@admin_target()
@config_option
@admin_server_options
@json_option
@click.option("--system", "system", is_flag=True,
              help="Also list the store's own system topics (rmq_sys_*).")
def list_(admin, as_json: bool, system: bool) -> None:
    """List the topics of the store in ROOT (or the served store, with --server).

    Each config, and the topics holding consume queues without one (their columns empty:
    they take queue_select.queues_per_topic). System topics (rmq_sys_*: the store's own
    state, which the state mirror ships to slaves) only with --system.
    """
    rows = [r for r in admin.topic_list() if system or not is_system_topic(r["topic"])]
    if as_json:
        output.emit_json(rows)
        return
    output.print_table(("topic", "read queues", "write queues", "perm", "stored queues"),
                       [(r["topic"], r["read_queues"], r["write_queues"],
                         None if r["perm"] is None else f"{r['perm']} {r['perm_text']}",
                         _ids(r["stored_queues"])) for r in rows])


@topic.command("delete")
@admin_target("name")
@click.confirmation_option(prompt="Delete the topic's config, consume queues and every "
                                  "group's offsets on it?",
                           help="Delete without asking.")
@config_option
@admin_server_options
@json_option
def delete(admin, name: str, as_json: bool) -> None:
    """Delete topic NAME, as RocketMQ's deleteTopic does.

    Its config, its consume queues and every group's offsets and pop state on it go. Its
    messages stay in the commit log until cleanup deletes their segments, and are never
    dispatched to it again; a later put to NAME (with topics.auto_create) starts a new topic
    at offset 0.

    Needs the store closed (it is opened for writing): through --server it is refused, saying
    so. Refused while consumers read NAME.
    """
    result = admin.topic_delete(name)
    if as_json:
        output.emit_json(result)
        return
    groups = ", ".join(result["groups"]) or "none"
    output.say(f"deleted topic {name}: consume queue(s) {_ids(result['queues']) or 'none'}; "
               f"offsets and pop state of group(s) {groups}")
    output.say(f"its messages stay in the commit log (below offset {result['records_below']}) "
               f"until cleanup deletes their segments")
    if result["declared"]:
        output.say(f"note: topics.declare in the configuration lists {name}: the next "
                   f"writable open creates it again")


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids))
