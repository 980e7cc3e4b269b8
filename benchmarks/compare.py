"""Before/after benchmark comparison in one run: a git revision of mqstore against the working tree.

    python benchmarks/compare.py --base <git-rev> [--rounds N] [--bench put_get,dispatch_lag,...]

The base revision's ``core/`` and ``plugins/`` are exported with ``git archive`` (read-only git
use) and copied into a temporary ``mqstore`` package (``core/`` -> ``mqstore/``, ``plugins/`` ->
``mqstore/plugins/``). Every benchmark then runs ``--rounds`` times on each side, alternating
base, head, base, head ..., each run a fresh subprocess of the same interpreter running the
same bench script from this directory: the base runs with PYTHONPATH pointing at the export
(so it wins over the working tree's editable install), the head runs with PYTHONPATH removed
(so the editable install, i.e. the working tree, is imported). A small wrapper checks, before
the bench starts, that ``mqstore`` and ``mqstore.plugins`` come from where they should, in the
bench process and in a process spawned the way the store spawns its workers. ``--head REV``
exports a second revision instead of using the working tree (``--base HEAD --head HEAD``
measures the pure noise floor even while the working tree is being edited); ``--head snapshot``
copies the working tree's ``core/`` and ``plugins/`` once at the start, so edits made during
the run (it takes minutes) do not reach some head runs and not others.

Each bench prints one ``BENCH-JSON`` line with ``--json``; the table shows per figure the
median of each side, the ratio head/base of the medians, the range of the per-round ratios
(head run / the base run just before it) and the spread of the base runs ((max - min) /
median). Figures marked "(no mqstore)" run no mqstore code at all: their ratios are the
machine's noise. Absolute figures on a shared machine drift by tens of percent between runs;
the interleaving makes both sides see the same drift, so compare ratios, not absolute values.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (script, arguments of the normal scale, arguments of --quick). The normal scale keeps
# a 3-round comparison of the default set at about 5-6 minutes on a 2-CPU machine.
BENCHES = {
    "put_get": ("bench_put_get.py", [], ["--quick"]),
    "dispatch_lag": ("bench_dispatch_lag.py", ["--seconds", "10"], ["--seconds", "3"]),
    "sync_flush": ("bench_sync_flush.py", ["--seconds", "3"], ["--seconds", "1"]),
    # Opt-in: these also exercise API beyond put/put_batch/get (subscriptions, key queries,
    # the recovery report), which a refactor may rename.
    "filter": ("bench_filter.py", ["--quick"], ["--count", "20000"]),
    "index": ("bench_index.py", ["--quick", "--entries", "400000", "--queries", "2000"],
              ["--count", "50000", "--entries", "100000", "--queries", "500"]),
    # Reads against SQLite: bulk read (skipped on revisions without it), get(32), get(1),
    # offset_by_time, each with its ratio to SQLite's measured beside it.
    "read_sqlite": ("bench_read_sqlite.py", ["--repeats", "3"], ["--quick"]),
    # Appends against SQLite, each timed until readable: put_batch of columns and of
    # Message objects, 128 B and 1 KiB (one round per run: compare.py repeats the runs).
    "append_sqlite": ("bench_append_sqlite.py", ["--rounds", "1"],
                      ["--count", "20000", "--rounds", "1"]),
}
DEFAULT_SET = "put_get,dispatch_lag,sync_flush"

WRAPPER = r'''
"""Runs one bench script after checking where mqstore is imported from (written by compare.py)."""
import os
import runpy
import sys


def where():
    import mqstore
    import mqstore.plugins
    return (os.path.dirname(os.path.realpath(mqstore.__file__)),
            os.path.dirname(os.path.realpath(mqstore.plugins.__file__)))


def report_where(queue):
    queue.put(where())


if __name__ == "__main__":
    expect, expect_plugins, script, *args = sys.argv[1:]
    wanted = (os.path.realpath(expect), os.path.realpath(expect_plugins))
    got = where()
    print(f"COMPARE-MQSTORE {got[0]} {got[1]}", flush=True)
    if got != wanted:
        sys.exit(f"compare: mqstore imported from {got}, expected {wanted}")
    import multiprocessing as mp  # the store starts its workers with spawn: check there too
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    proc = ctx.Process(target=report_where, args=(queue,))
    proc.start()
    child = queue.get()
    proc.join()
    if tuple(child) != wanted:
        sys.exit(f"compare: a spawned process imports mqstore from {child}, expected {wanted}")
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as when the script runs itself
    runpy.run_path(script, run_name="__main__")
'''


def git(repo: Path, *args: str) -> str:
    """Read-only git: --no-optional-locks keeps even ``status`` from refreshing the index."""
    return subprocess.run(["git", "--no-optional-locks", "-C", str(repo), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def export(repo: Path, rev: str, dest: Path) -> Path:
    """``git archive rev core plugins`` into dest/src, arranged as dest/pkg/mqstore (copies)."""
    src = dest / "src"
    src.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", rev, "core", "plugins"],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(src)], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        raise SystemExit(f"git archive {rev} core plugins failed")
    if (src / "core" / "plugins").exists():
        raise SystemExit(f"{rev}: core/plugins exists, it would clash with plugins/")
    pkg = dest / "pkg"
    shutil.copytree(src / "core", pkg / "mqstore", symlinks=False)
    shutil.copytree(src / "plugins", pkg / "mqstore" / "plugins", symlinks=False)
    shutil.rmtree(src)
    return pkg


def tree_fingerprint(repo: Path) -> str:
    """Content hash of the working tree's core/ and plugins/ (to notice edits during a run)."""
    h = hashlib.sha256()
    for top in ("core", "plugins"):
        for path in sorted((repo / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(repo)).encode() + b"\0")
                h.update(path.read_bytes())
    return h.hexdigest()[:12]


class Side:
    """One side of the comparison: what goes on PYTHONPATH (None: nothing, so the editable
    install answers) and where mqstore and mqstore.plugins must then be imported from."""

    def __init__(self, name: str, label: str, pythonpath: Path | None, expect: Path,
                 expect_plugins: Path) -> None:
        self.name, self.label, self.pythonpath = name, label, pythonpath
        self.expect, self.expect_plugins = expect.resolve(), expect_plugins.resolve()

    def env(self) -> dict:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        if self.pythonpath is not None:
            env["PYTHONPATH"] = str(self.pythonpath)
        return env


def run_one(python: str, wrapper: Path, side: Side, script: Path, args: list[str],
            log: Path, timeout: float, cwd: Path) -> tuple[dict | None, str, float]:
    """One bench run in a fresh process group; returns (BENCH-JSON record or None, note, s)."""
    cmd = [python, str(wrapper), str(side.expect), str(side.expect_plugins), str(script),
           *args, "--json"]
    t0 = time.perf_counter()
    with open(log, "w") as out:
        out.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        out.write(f"# PYTHONPATH={side.env().get('PYTHONPATH', '(unset)')}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=side.env(),
                                cwd=cwd, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except BaseException as exc:  # a timeout, or ^C: the run has its own session
            os.killpg(proc.pid, signal.SIGKILL)  # the bench and the workers it spawned
            proc.wait()
            if not isinstance(exc, subprocess.TimeoutExpired):
                raise
            return None, f"timed out after {timeout:.0f} s", time.perf_counter() - t0
    elapsed = time.perf_counter() - t0
    record, where = None, None
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("BENCH-JSON "):
            record = json.loads(line[len("BENCH-JSON "):])
        elif line.startswith("COMPARE-MQSTORE "):
            where = line.split()[1]
    if rc != 0 or record is None:
        return None, f"exit {rc}: {first_error(log)[:150]}", elapsed
    if where != str(side.expect) or \
            os.path.dirname(os.path.realpath(record["mqstore"])) != str(side.expect):
        return None, f"imported mqstore from {where}, not {side.expect}", elapsed
    return record, "ok", elapsed


def first_error(log: Path) -> str:
    """The exception line of the first traceback in a log (or its last line)."""
    lines = [l for l in log.read_text(errors="replace").splitlines() if l.strip()]
    in_tb = False
    for line in lines:
        if line.startswith("Traceback"):
            in_tb = True
        elif in_tb and not line[0].isspace():
            return line
    return lines[-1] if lines else "no output"


def fmt(v: float) -> str:
    if v != v:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def print_table(benches: list[str], results: dict, rounds: int) -> None:
    """results[bench][side] = list over rounds of {metric: (value, unit, better)} or None."""
    rows = []
    for bench in benches:
        names: list[str] = []
        info = {}
        for side in ("base", "head"):
            for rec in results[bench][side]:
                for name, (value, unit, better) in (rec or {}).items():
                    if name not in info:
                        names.append(name)
                        info[name] = (unit, better)
        if not names:
            rows.append((bench, "(no successful run)", "", "", "", "", "", "", ""))
            continue
        for name in names:
            unit, better = info[name]
            vals = {s: [r[name][0] if r and name in r else None for r in results[bench][s]]
                    for s in ("base", "head")}
            ok = {s: [v for v in vals[s] if v is not None] for s in vals}
            med = {s: statistics.median(ok[s]) if ok[s] else float("nan") for s in ok}
            ratio = med["head"] / med["base"] if ok["base"] and ok["head"] and med["base"] \
                else float("nan")
            pairs = [h / b for b, h in zip(vals["base"], vals["head"])
                     if b is not None and h is not None and b]
            pair_range = f"{min(pairs):.3f}-{max(pairs):.3f}" if pairs else "-"
            spread = ((max(ok["base"]) - min(ok["base"])) / med["base"]
                      if len(ok["base"]) > 1 and med["base"] else float("nan"))
            runs = f"{len(ok['base'])}/{len(ok['head'])}"
            rows.append((bench, name, unit, fmt(med["base"]), fmt(med["head"]),
                         f"{ratio:.3f}" if ratio == ratio else "-", pair_range,
                         f"{spread:.0%}" if spread == spread else "-",
                         better if runs == f"{rounds}/{rounds}" else
                         f"{better} (runs {runs})"))
    head = ("bench", "metric", "unit", "base median", "head median", "head/base",
            "round ratios", "base spread", "better")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    right = {3, 4, 5, 6, 7}

    def line(r):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    print(line(head))
    print("-" * len(line(head)))
    last = None
    for r in rows:
        if last is not None and r[0] != last:
            print()
        print(line(r if r[0] != last else ("",) + r[1:]))
        last = r[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--head", default="worktree",
                    help="'worktree' (default: the editable install of the working tree), "
                         "'snapshot' (a copy of the working tree's core/ and plugins/ taken at "
                         "the start, so edits during the run do not reach the head runs) or a "
                         "second git revision to export")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each bench per side")
    ap.add_argument("--bench", default=DEFAULT_SET,
                    help=f"comma-separated, from {', '.join(BENCHES)} (default {DEFAULT_SET})")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--bench-args", action="append", default=[], metavar="BENCH=ARGS",
                    help="replace a bench's arguments, e.g. put_get='--count 50000'")
    ap.add_argument("--repo", type=Path, default=HERE.parent, help="the git working tree")
    ap.add_argument("--python", help="interpreter for the runs (default: <repo>/.venv/bin/python)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per bench run")
    ap.add_argument("--keep", action="store_true", help="keep the exported packages")
    args = ap.parse_args()

    benches = [b.strip() for b in args.bench.split(",") if b.strip()]
    unknown = [b for b in benches if b not in BENCHES]
    if unknown or not benches or args.rounds < 1:
        ap.error(f"unknown bench {unknown}; choose from {', '.join(BENCHES)}" if unknown
                 else "need at least one bench and one round")
    bench_args = {b: list(BENCHES[b][2 if args.quick else 1]) for b in benches}
    for item in args.bench_args:
        name, sep, rest = item.partition("=")
        if not sep or name not in BENCHES:
            ap.error(f"--bench-args wants BENCH=ARGS with BENCH one of {', '.join(BENCHES)}")
        bench_args[name] = shlex.split(rest)
    repo = args.repo.resolve()
    python = args.python or str(repo / ".venv" / "bin" / "python")
    if not os.access(python, os.X_OK):
        ap.error(f"no interpreter at {python} (give --python)")

    work = Path(tempfile.mkdtemp(prefix="mqstore-compare-"))
    logs = work / "logs"
    logs.mkdir()
    wrapper = work / "run_bench.py"
    wrapper.write_text(WRAPPER)
    started = time.perf_counter()

    base_sha = git(repo, "rev-parse", "--verify", f"{args.base}^{{commit}}")
    base_pkg = export(repo, base_sha, work / "base")
    sides = {"base": Side("base", f"{args.base} = {base_sha[:12]} "
                                  f"({git(repo, 'log', '-1', '--format=%s', base_sha)[:60]})",
                          base_pkg, base_pkg / "mqstore", base_pkg / "mqstore" / "plugins")}
    if args.head == "snapshot":
        head_pkg = work / "head" / "pkg"
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(repo / "core", head_pkg / "mqstore", ignore=skip)
        shutil.copytree(repo / "plugins", head_pkg / "mqstore" / "plugins", ignore=skip)
        sides["head"] = Side("head", f"copy of the working tree {repo} taken at the start "
                                     f"(tree {tree_fingerprint(repo)})", head_pkg,
                             head_pkg / "mqstore", head_pkg / "mqstore" / "plugins")
    elif args.head == "worktree":
        dirty = git(repo, "status", "--porcelain", "--", "core", "plugins")
        sides["head"] = Side("head", f"working tree {repo} (editable install; "
                                     f"{len(dirty.splitlines())} changed paths in core/ and "
                                     f"plugins/ vs HEAD)", None, repo / "core", repo / "plugins")
    else:
        head_sha = git(repo, "rev-parse", "--verify", f"{args.head}^{{commit}}")
        head_pkg = export(repo, head_sha, work / "head")
        sides["head"] = Side("head", f"{args.head} = {head_sha[:12]} (exported)", head_pkg,
                             head_pkg / "mqstore", head_pkg / "mqstore" / "plugins")

    print(f"compare: base {sides['base'].label}")
    print(f"         head {sides['head'].label}")
    print(f"         python {python}; {args.rounds} rounds of "
          + ", ".join(f"{b} {' '.join(bench_args[b]) or '(defaults)'}" for b in benches))
    print(f"         logs {logs}; load average {os.getloadavg()[0]:.2f} at start", flush=True)

    results = {b: {"base": [], "head": []} for b in benches}
    failures = []
    fingerprints = []
    for rnd in range(1, args.rounds + 1):
        for bench in benches:
            script = HERE / BENCHES[bench][0]
            for side in ("base", "head"):
                if side == "head" and args.head == "worktree":
                    fingerprints.append((rnd, bench, tree_fingerprint(repo)))
                log = logs / f"{bench}-r{rnd}-{side}.log"
                record, note, secs = run_one(python, wrapper, sides[side], script,
                                             bench_args[bench], log, args.timeout, work)
                metrics = None
                if record is not None:
                    metrics = {n: (v, u, b) for n, v, u, b in record["metrics"]}
                else:
                    failures.append(f"{bench} round {rnd} {side}: {note} (log {log})")
                results[bench][side].append(metrics)
                print(f"  round {rnd}/{args.rounds}  {bench:<13} {side:<4} {secs:6.1f} s  {note}",
                      flush=True)

    (logs / "results.json").write_text(json.dumps(
        {"base": sides["base"].label, "head": sides["head"].label, "bench_args": bench_args,
         "results": results}, indent=1))
    if not args.keep:
        for name in ("base", "head"):
            shutil.rmtree(work / name, ignore_errors=True)

    print()
    print_table(benches, results, args.rounds)
    print()
    print("head/base: ratio of the medians; round ratios: each head run over the base run just "
          "before it;\nbase spread: (max - min) / median of the base runs. '(no mqstore)' rows "
          "run no mqstore code:\ntheir ratios are the machine's noise.")
    changed = sorted({fp for _, _, fp in fingerprints})
    if len(changed) > 1:
        print("WARNING: the working tree's core/ and plugins/ changed during the comparison; "
              "head runs measured different code:")
        for rnd, bench, fp in fingerprints:
            print(f"  round {rnd} {bench}: tree {fp}")
    for f in failures:
        print("FAILED", f)
    print(f"total {time.perf_counter() - started:.0f} s; load average "
          f"{os.getloadavg()[0]:.2f} at the end; logs and results.json in {logs}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
