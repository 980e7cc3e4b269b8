"""``mqstore bench``: the throughput benchmark against the bare-copy baseline."""

from __future__ import annotations

import click

from mqstore.cli import output
from mqstore.cli.options import config_option, json_option, load_cli_config
from mqstore.ops.bench import run_bench


@click.command()
@click.option("-n", "--count", type=click.IntRange(100), default=100_000, show_default=True,
              help="Messages to write.")
@click.option("--body-bytes", type=click.IntRange(1), default=1024, show_default=True,
              help="Bytes per message body.")
@click.option("--batch", type=click.IntRange(1), default=1000, show_default=True,
              help="Messages per put_batch call.")
@click.option("--segment-bytes", type=click.IntRange(1 << 16), default=256 << 20,
              show_default=True, help="Commit-log segment size of the benchmark store.")
@click.option("--dispatch", type=click.Choice(["process", "thread"]), default="process",
              show_default=True, help="Where the dispatch loop runs.")
@config_option
@json_option
def bench(count: int, body_bytes: int, batch: int, segment_bytes: int, dispatch: str,
          config_path: str | None, as_json: bool) -> None:
    """Measure put_batch, dispatch and get throughput in a fresh temporary store, against a
    bare Python copy of the same records into an mmap (the baseline, measured in the same
    run). Each phase covers all N messages; dispatch runs beside the puts, so its time runs
    from the first put until the last message is dispatched. "x base" is a phase's MB/s over the baseline's: the figure to compare across
    machines. The store lives in the system temp directory (TMPDIR) and is deleted after.
    """
    config = load_cli_config(config_path, commit_log={"segment_bytes": segment_bytes},
                             dispatch={"worker": dispatch})
    with output.progress("bench", count, enabled=not as_json) as (advance, set_total):
        state = {"phase": None, "done": 0}

        def progress(phase: str, done: int, total: int) -> None:
            if phase != state["phase"]:
                state.update(phase=phase, done=0)
                set_total(total)
            advance(done - state["done"])
            state["done"] = done

        phases = run_bench(config, count, body_bytes, batch, progress)
    if as_json:
        output.emit_json({"count": count, "body_bytes": body_bytes, "batch": batch,
                          "phases": [p.to_dict() for p in phases]})
        return
    output.print_table(
        ("phase", "messages", "seconds", "msg/s", "MB/s", "x base"),
        [(p.name, p.messages, f"{p.seconds:.3f}", f"{p.msg_per_s:,.0f}", f"{p.mb_per_s:,.1f}",
          f"{p.x_base:.2f}" if p.x_base is not None else "") for p in phases],
        title=f"{count} messages of {body_bytes} B, put_batch of {batch}")
