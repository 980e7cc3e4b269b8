"""``mqstore role status|promote|demote [DIR] ...``: a store's replication role, changed while it
runs through ``--server HOST:PORT`` (docs/replication.md, "Failover"), or recorded in a
closed store's directory for its next start."""

from __future__ import annotations

import click

from mqstore.cli import output
from mqstore.cli.options import config_option, json_option
from mqstore.cli.topic import admin_server_options, admin_target

MASTER_ROLES = click.Choice(["async_master", "sync_master"])


@click.group()
def role() -> None:
    """Show and change a store's replication role: promote a slave to master, make a master
    follow another store.

    With --server the change happens in the running `mqstore serve`, at once; on a store
    directory it is recorded (role.json) and taken up when the store starts.
    """


@role.command("status")
@admin_target()
@config_option
@admin_server_options
@json_option
def status(admin, as_json: bool) -> None:
    """Show the role, epochs and replication state of the store in ROOT (or --server); with
    automatic failover, the coordination's too (the leader, its epoch, whether this node may
    write, why it waits, what it did last)."""
    result = admin.role_status()
    if as_json:
        output.emit_json(result)
        return
    shown = {k: v for k, v in result.items()
             if k not in ("replication", "recorded", "coordination")}
    shown["epochs"] = ", ".join(f"{e}-{s}" for e, s in result.get("epochs", [])) or "none"
    output.print_fields(shown, title="role")
    if result.get("replication"):
        output.print_fields(result["replication"], title="replication")
    if result.get("coordination"):
        output.print_fields(result["coordination"], title="coordination")


@role.command("promote")
@admin_target()
@click.option("--force", is_flag=True,
              help="Promote even while the master still serves this slave, or when the slave "
                   "lacks bytes the master had answered PUT_OK for (they are lost).")
@click.option("--epoch", type=click.IntRange(1, 2**31 - 1), default=None,
              help="The epoch to be master in (default: one above every epoch it knows).")
@click.option("--role", "as_role", type=MASTER_ROLES, default=None,
              help="async_master or sync_master (default: store.role when it is a master "
                   "role, else async_master).")
@config_option
@admin_server_options
@json_option
def promote(admin, force: bool, epoch: int | None, as_role: str | None, as_json: bool) -> None:
    """Make the slave in ROOT (or --server) the master.

    It stops following, starts a new epoch at its log's end, takes puts, listens for slaves
    on server.ha_listen and asks server.ha_peers. Refused while its master still serves it,
    and when it lacks acknowledged messages (it says how many bytes), unless --force.
    """
    result = admin.role_promote(force=force, epoch=epoch, role=as_role)
    if as_json:
        output.emit_json(result)
        return
    lacked = result.get("lacked")
    shown = {k: v for k, v in result.items() if k not in ("lacked", "mirror")}
    shown["lacked"] = (f"{lacked['bytes']} bytes [{lacked['from']}, {lacked['to']})"
                       if lacked else "nothing")
    output.print_fields(shown, title="promoted")


@role.command("demote")
@admin_target()
@click.option("--master", required=True, metavar="HOST:PORT",
              help="The new master's server.ha_listen.")
@config_option
@admin_server_options
@json_option
def demote(admin, master: str, as_json: bool) -> None:
    """Make the store in ROOT (or --server) a slave of MASTER.

    A master stops taking puts at once and reopens as a slave; records the new master lacks
    are cut and kept in quarantine/ with a report (docs/replication.md, "Rejoining").
    """
    result = admin.role_demote(master)
    if as_json:
        output.emit_json(result)
    else:
        output.print_fields(result, title="demoted")
