"""``mqstore topic create|update|list|delete DIR ...``: topic configs, as ``mqadmin`` manages
a broker's (``config/topics.json``; docs/topics.md)."""

from __future__ import annotations

import click

from mqstore.cli import output
from mqstore.cli.options import config_option, existing_root, json_option, load_cli_config
from mqstore.ops.admin import StoreAdmin

COUNT = click.IntRange(1, 65_536)
PERM = click.Choice(["2", "4", "6"])
FIELDS = ("read_queues", "write_queues", "perm", "perm_text")


def admin(root: str, config_path: str | None) -> StoreAdmin:
    """What every topic and group command works through: the store directory ROOT."""
    return StoreAdmin(root, load_cli_config(config_path))


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
@existing_root
@click.argument("name")
@_queue_options
@click.option("-p", "--perm", type=PERM, default="6", show_default=True,
              help="2 write only, 4 read only, 6 read and write.")
@config_option
@json_option
def create(root: str, name: str, queues: int | None, read_queues: int | None,
           write_queues: int | None, perm: str, config_path: str | None, as_json: bool) -> None:
    """Create topic NAME in the store in ROOT.

    Works on a closed store and beside a running writer, which follows within a second. The
    first config a store records also lists the topics it already holds.
    """
    result = admin(root, config_path).topic_create(name, queues=queues, read_queues=read_queues,
                                                   write_queues=write_queues, perm=int(perm))
    if as_json:
        output.emit_json(result)
    else:
        output.print_fields(result, title="topic created")


@topic.command("update")
@existing_root
@click.argument("name")
@_queue_options
@click.option("-p", "--perm", type=PERM, default=None,
              help="2 write only, 4 read only, 6 read and write.")
@config_option
@json_option
def update(root: str, name: str, queues: int | None, read_queues: int | None,
           write_queues: int | None, perm: str | None, config_path: str | None,
           as_json: bool) -> None:
    """Change topic NAME's queue counts or permission (what is not given stays).

    Works on a closed store and beside a running writer, which follows within a second.
    Fewer write queues stop puts to the queues past them; their messages stay readable.
    """
    if queues is None and read_queues is None and write_queues is None and perm is None:
        raise click.UsageError("nothing to change: give --queues, --read-queues, "
                               "--write-queues or --perm")
    result = admin(root, config_path).topic_update(
        name, queues=queues, read_queues=read_queues, write_queues=write_queues,
        perm=None if perm is None else int(perm))
    if as_json:
        output.emit_json(result)
        return
    before = result["before"]
    output.print_table(("field", "before", "after"),
                       [(f, before[f], result[f]) for f in FIELDS], title=f"topic {name} updated")


@topic.command("list")
@existing_root
@config_option
@json_option
def list_(root: str, config_path: str | None, as_json: bool) -> None:
    """List the topics of the store in ROOT.

    Each config, and the topics holding consume queues without one (their columns empty:
    they take queue_select.queues_per_topic).
    """
    rows = admin(root, config_path).topic_list()
    if as_json:
        output.emit_json(rows)
        return
    output.print_table(("topic", "read queues", "write queues", "perm", "stored queues"),
                       [(r["topic"], r["read_queues"], r["write_queues"],
                         None if r["perm"] is None else f"{r['perm']} {r['perm_text']}",
                         _ids(r["stored_queues"])) for r in rows])


@topic.command("delete")
@existing_root
@click.argument("name")
@click.confirmation_option(prompt="Delete the topic's config, consume queues and every "
                                  "group's offsets on it?",
                           help="Delete without asking.")
@config_option
@json_option
def delete(root: str, name: str, config_path: str | None, as_json: bool) -> None:
    """Delete topic NAME, as RocketMQ's deleteTopic does.

    Its config, its consume queues and every group's offsets and pop state on it go. Its
    messages stay in the commit log until cleanup deletes their segments, and are never
    dispatched to it again; a later put to NAME (with topics.auto_create) starts a new topic
    at offset 0.

    Needs the store closed (it is opened for writing); refused while consumers read NAME.
    """
    result = admin(root, config_path).topic_delete(name)
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
