"""Plugins: a real third-party package found through its entry point, and class plugins in-process.

The third-party package is ``tests/plugin_pkg``: it is pip-installed into a temporary directory
and a fresh interpreter opens a store with that directory on ``PYTHONPATH``. In-process plugins
are class instances placed in ``sys.modules`` under a module name and named in
``plugins.modules``, exactly as a plugin module would be.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pluggy
import pytest

from mqstore.plugin_api.contracts import READS_STORE, CleanupDecision, StoreReads, Writer
from mqstore import GetStatus, Message, MessageStore, PutStatus, hookimpl, load_config
from mqstore.errors import ConfigError, PluginError
from mqstore.plugin_api.manager import DEFAULT_PLUGINS, PluginHooks, make_plugin_manager
from paths import TESTS

PLUGIN_PKG = TESTS / "plugin_pkg"
DEMO_MODULE = "mqstore_demo_plugin"
GROUP = "G"


# -- a real third-party package, loaded through the ``mqstore`` entry-point group -------------

STORE_SCRIPT = textwrap.dedent("""
    import sys
    from mqstore import Message, MessageStore, load_config
    from mqstore.errors import PluginError

    root = sys.argv[1]
    config_path = sys.argv[2] if len(sys.argv) > 2 else None
    config = load_config(config_path, overrides={"store": {"hash": "java"}})
    with MessageStore.open(root, config) as store:
        store.put(Message("T", b"red", properties={"color": "red"}, queue_id=0))
        store.put(Message("T", b"green", properties={"color": "green"}, queue_id=0))
        store.put_batch([
            Message("T", b"rose", properties={"color": "rose"}, queue_id=0),
            Message("T", b"blue", properties={"color": "blue"}, queue_id=0),
            Message("T", b"plain", queue_id=0),
        ])
        store.wait_dispatched()
        try:
            r = store.get("G", "T", 0, 0, 32, expression="color=^r", expression_type="REGEX")
        except PluginError as exc:
            print("PluginError:", exc)
        else:
            print("REGEX:", r.status.name, [m.body.decode() for m in r.messages],
                  "filtered", r.filtered_count)
    plugin = sys.modules.get("mqstore_demo_plugin")
    print("after_append:", plugin.CALLS if plugin is not None else "not loaded")
""")

LOADED_OUTPUT = (
    "REGEX: FOUND ['red', 'rose'] filtered 3\n"
    "after_append: {'calls': 3, 'messages': 5}\n"
)


@pytest.fixture(scope="module")
def demo_site(tmp_path_factory):
    """``tests/plugin_pkg`` pip-installed (for real) into a fresh target directory."""
    base = tmp_path_factory.mktemp("demo_plugin")
    src = base / "src"
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    shutil.copytree(PLUGIN_PKG, src, ignore=shutil.ignore_patterns("__pycache__", "build",
                                                                   "*.egg-info"))
    site = base / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
         "--no-index", "--disable-pip-version-check", "--quiet", "--target", str(site), str(src)],
        capture_output=True, text=True, cwd=base,
    )
    hint = ("\nthis interpreter's setuptools cannot build wheels without build isolation: the "
            "test environment needs setuptools>=70.1 or the wheel package"
            if "bdist_wheel" in proc.stderr else "")
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}{hint}"
    return site


def run_store(site, root, *, env=None, config_text=None):
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
    child_env["PYTHONPATH"] = str(site)
    child_env.update(env or {})
    args = [sys.executable, "-c", STORE_SCRIPT, str(root)]
    if config_text is not None:
        config_path = Path(root).parent / f"{Path(root).name}.yaml"
        config_path.write_text(config_text)
        args.append(str(config_path))
    proc = subprocess.run(args, capture_output=True, text=True, env=child_env,
                          cwd=Path(root).parent)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_installed_package_exposes_the_entry_point(demo_site):
    (dist_info,) = demo_site.glob("mqstore_demo_plugin-*.dist-info")
    assert "[mqstore]\ndemo = mqstore_demo_plugin" in (dist_info / "entry_points.txt").read_text()
    assert (demo_site / "mqstore_demo_plugin.py").is_file()


def test_installed_plugin_is_picked_up_by_a_store(demo_site, tmp_path):
    assert run_store(demo_site, tmp_path / "store") == LOADED_OUTPUT


def test_allow_list_naming_the_plugin_loads_it(demo_site, tmp_path):
    out = run_store(demo_site, tmp_path / "store", env={"MQSTORE_LOAD_PLUGINS": "other, demo"})
    assert out == LOADED_OUTPUT


@pytest.mark.parametrize("allow", ["", "other"])
def test_allow_list_without_the_plugin_does_not_load_it(demo_site, tmp_path, allow):
    out = run_store(demo_site, tmp_path / "store", env={"MQSTORE_LOAD_PLUGINS": allow})
    error, loaded = out.splitlines()
    assert error.startswith("PluginError: ")
    assert "'REGEX'" in error and "TAG" in error
    assert loaded == "after_append: not loaded"


@pytest.mark.slow
def test_plugins_disable_in_config_blocks_the_plugin(demo_site, tmp_path):
    out = run_store(demo_site, tmp_path / "store", config_text="plugins: {disable: [demo]}\n")
    error, loaded = out.splitlines()
    assert error.startswith("PluginError: ") and "'REGEX'" in error
    assert loaded == "after_append: not loaded"


def test_disable_env_blocks_the_plugin(demo_site, tmp_path):
    out = run_store(demo_site, tmp_path / "store", env={"MQSTORE_DISABLE_PLUGINS": "other,demo"})
    error, loaded = out.splitlines()
    assert error.startswith("PluginError: ") and "'REGEX'" in error
    assert loaded == "after_append: not loaded"


def test_load_entry_points_false_ignores_the_installed_plugin(demo_site, tmp_path):
    out = run_store(demo_site, tmp_path / "store",
                    config_text="plugins: {load_entry_points: false}\n")
    assert out.splitlines()[1] == "after_append: not loaded"


# -- in-process plugins -----------------------------------------------------------------------

pytestmark = pytest.mark.usefixtures("no_plugin_env")


@pytest.fixture
def add_plugin(monkeypatch):
    """``add_plugin(name, plugin)``: make ``plugin`` importable as module ``name``."""
    def add(name, plugin):
        monkeypatch.setitem(sys.modules, name, plugin)
        return name
    return add


def with_modules(*names, **sections):
    return {"plugins": {"modules": list(names)}, **sections}


@pytest.fixture
def demo_module(monkeypatch):
    """The demo package's module, imported fresh from the source tree."""
    monkeypatch.syspath_prepend(str(PLUGIN_PKG))
    monkeypatch.delitem(sys.modules, DEMO_MODULE, raising=False)
    yield DEMO_MODULE
    sys.modules.pop(DEMO_MODULE, None)


def test_plugin_module_named_in_config_registers_a_filter(make_store, demo_module):
    store = make_store(with_modules(demo_module))
    store.put(Message("T", b"a", properties={"color": "red"}, queue_id=0))
    store.put(Message("T", b"b", properties={"color": "blue"}, queue_id=0))
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 0, 32, expression="color=e$", expression_type="regex")
    assert r.status is GetStatus.FOUND
    assert [m.body for m in r.messages] == [b"b"]
    assert r.filtered_count == 1
    assert sys.modules[demo_module].CALLS == {"calls": 2, "messages": 2}


def test_unimportable_plugin_module_fails_with_plugin_error(make_store):
    with pytest.raises(PluginError, match="'no_such_mqstore_plugin_module'"):
        make_store(with_modules("no_such_mqstore_plugin_module"))


class _RecordingDispatcher:
    def __init__(self, owner) -> None:
        self.owner = owner

    def dispatch(self, batch) -> None:
        self.owner.batches.append(batch)

    def close(self) -> None:
        self.owner.closed += 1


class DispatchRecorder:
    def __init__(self) -> None:
        self.batches = []
        self.after = []
        self.closed = 0

    @hookimpl
    def register_dispatchers(self, registry):
        registry.add("recorder", lambda view, role: _RecordingDispatcher(self))

    @hookimpl
    def after_dispatch(self, batch):
        self.after.append(batch)


@pytest.mark.loops("thread")
def test_dispatcher_sees_every_record_exactly_once(make_store, add_plugin):
    rec = DispatchRecorder()
    store = make_store(with_modules(add_plugin("recording_dispatcher", rec)))
    batch_msgs = [Message("A" if i % 2 else "B", b"x" * i, tags="t", queue_id=i % 3)
                  for i in range(10)]
    batch = store.put_batch(batch_msgs)
    assert batch.status is PutStatus.PUT_OK
    singles = [store.put(Message("C", b"single", queue_id=1)) for _ in range(3)]
    assert all(r.status is PutStatus.PUT_OK for r in singles)
    store.wait_dispatched()

    expected = {}
    for msg, r in zip(batch_msgs + [Message("C", b"single")] * 3, list(batch) + singles):
        expected[r.phys_offset] = (msg.topic, r.queue_id, r.queue_offset, r.size)
    seen = []
    for b in rec.batches:
        for i in range(len(b)):
            seen.append((int(b.phys_offsets[i]), (b.topics[i], int(b.queue_ids[i]),
                                                  int(b.queue_offsets[i]), int(b.sizes[i]))))
    assert sorted(p for p, _ in seen) == sorted(expected)  # every record, none twice
    assert dict(seen) == expected
    assert [p for p, _ in seen] == sorted(p for p, _ in seen)  # log order
    for b in rec.batches:
        assert b.begin <= int(b.phys_offsets[0])
        assert int(b.phys_offsets[-1] + b.sizes[-1]) <= b.end
    assert all(a.end <= b.begin for a, b in zip(rec.batches, rec.batches[1:]))
    # The consume-queue builder still ran next to the plugin's dispatcher.
    assert store.max_offset("C", 1) == 3
    store.close()
    assert rec.closed == 1


@pytest.mark.loops("thread")
def test_after_dispatch_is_called_once_per_batch(make_store, add_plugin):
    rec = DispatchRecorder()
    store = make_store(with_modules(add_plugin("recording_dispatcher", rec)))
    result = store.put_batch([Message("T", b"m", queue_id=0) for _ in range(20)])
    store.put(Message("T", b"last", queue_id=0))
    store.wait_dispatched()
    assert len(rec.after) == len(rec.batches)
    assert all(a is b for a, b in zip(rec.after, rec.batches))
    assert sum(len(b) for b in rec.after) == 21
    assert len(rec.after) < 21
    # A put_batch block becomes visible at once, so one batch carries all 20 of its records.
    first = int(result.phys_offsets[0])
    (holder,) = [b for b in rec.after if first in b.phys_offsets.tolist()]
    assert set(result.phys_offsets.tolist()) <= set(holder.phys_offsets.tolist())


class AppendCounter:
    def __init__(self) -> None:
        self.before = []
        self.after = []

    @hookimpl
    def before_append(self, messages):
        self.before.append(len(messages))

    @hookimpl
    def after_append(self, result):
        self.after.append((result.status, len(result)))


@pytest.mark.loops("thread")  # the plugin module lives in this process only
def test_append_hooks_run_once_per_call(make_store, add_plugin):
    counter = AppendCounter()
    store = make_store(with_modules(add_plugin("append_counter", counter)))
    store.put(Message("T", b"one", queue_id=0))
    store.put_batch([Message("T", b"many", queue_id=0) for _ in range(4)])
    rejected = store.put(Message("T", None, queue_id=0))
    assert rejected.status is PutStatus.MESSAGE_ILLEGAL
    assert counter.before == [1, 4, 1]
    assert counter.after == [(PutStatus.PUT_OK, 1), (PutStatus.PUT_OK, 4),
                             (PutStatus.MESSAGE_ILLEGAL, 0)]


class CountingWriterPlugin:
    def __init__(self) -> None:
        self.writes = []
        self.made = 0

    @hookimpl
    def register_writers(self, registry):
        registry.add("counting", self.make_writer)

    def make_writer(self, ctx):
        self.made += 1
        plugin = self

        class CountingWriter(Writer):
            def write(self, segment, data):
                plugin.writes.append(len(data))
                return segment.write(data)

        return CountingWriter()


@pytest.mark.loops("thread")
def test_writer_is_selected_by_writer_kind(make_store, add_plugin):
    plugin = CountingWriterPlugin()
    store = make_store(with_modules(add_plugin("counting_writer", plugin),
                                    writer={"kind": "counting"}))
    r1 = store.put(Message("T", b"first", queue_id=0))
    rb = store.put_batch([Message("T", b"b%d" % i, queue_id=0) for i in range(3)])
    assert plugin.made == 1
    assert plugin.writes == [r1.size, rb.wrote_bytes]
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 0, 32)
    assert [m.body for m in r.messages] == [b"first", b"b0", b"b1", b"b2"]


@pytest.mark.loops("thread")  # the plugin module lives in this process only
def test_registered_writer_is_unused_unless_selected(make_store, add_plugin):
    plugin = CountingWriterPlugin()
    store = make_store(with_modules(add_plugin("counting_writer", plugin)))
    assert store.put(Message("T", b"x", queue_id=0)).status is PutStatus.PUT_OK
    assert plugin.made == 0 and plugin.writes == []


@pytest.mark.parametrize("section, key, kind, builtins", [
    ("writer", "kind", "writer", ["mmap", "transient_pool"]),
    ("queue_select", "selector", "queue selector", ["key_hash", "random", "round_robin"]),
])
def test_unknown_strategy_name_fails_naming_it_and_the_registered_ones(
        make_store, add_plugin, section, key, kind, builtins):
    plugin = CountingWriterPlugin()
    with pytest.raises(PluginError) as info:
        make_store(with_modules(add_plugin("counting_writer", plugin),
                                **{section: {key: "no_such_thing"}}))
    message = str(info.value)
    assert f"{kind} 'no_such_thing'" in message
    listed = message.split("registered:", 1)[1]
    expected = builtins + (["counting"] if section == "writer" else [])
    assert sorted(n.strip() for n in listed.split(",")) == sorted(expected)
    # The failed open released the directory.
    assert make_store().put(Message("T", b"x", queue_id=0)).status is PutStatus.PUT_OK


class StoreReadingPolicyPlugin:
    """Registers ``reading`` (declares READS_STORE, has ``bind``) and ``bindless`` (declares
    it without ``bind``)."""

    def __init__(self) -> None:
        self.bound = []

    @hookimpl
    def register_cleanup_policies(self, registry):
        registry.add("reading", self.make_reading)
        registry.add("bindless", self.make_bindless)

    def make_reading(self, config):
        plugin = self

        class Reading:
            capabilities = frozenset({READS_STORE})

            def bind(self, store):
                plugin.bound.append(store)

            def decide(self, now_ms, disk_used):
                return CleanupDecision(False, 0, None)

        return Reading()

    def make_bindless(self, config):
        class Bindless:
            capabilities = frozenset({READS_STORE})

            def decide(self, now_ms, disk_used):
                return CleanupDecision(False, 0, None)

        return Bindless()


@pytest.mark.loops("thread")
def test_store_reading_cleanup_policy_is_bound_to_the_store_read_api(make_store, add_plugin):
    plugin = StoreReadingPolicyPlugin()
    store = make_store(with_modules(add_plugin("reading_policy", plugin),
                                    cleanup={"policy": "reading"}))
    store.put_batch([Message("T", b"m%d" % i, queue_id=1) for i in range(3)])
    store.wait_dispatched()
    [bound] = plugin.bound
    # The calls contracts.StoreReads lists, on a weak proxy of the store.
    assert bound.root == store.root and bound.clock() == store.clock()
    assert bound.topics() == ["T"] and bound.queue_ids("T") == [1]
    assert (bound.min_offset("T", 1), bound.max_offset("T", 1)) == (0, 3)
    assert bound.read("T", 1, 1, 1, verify=False).queue_offsets.tolist() == [1]
    assert bound.consumed_floor() == (-1, None)  # no group has an offset yet
    with store.consumer("G", "T", consume_from="first") as group:
        assert len(group.poll(max_msgs=1, timeout_ms=5000)) == 1
        group.commit()
    floor, who = bound.consumed_floor()
    assert floor == store.get("G", "T", 1, 1, 1).messages[0].phys_offset
    assert "'G'" in who and "T/1 offset 1" in who
    listed = set(StoreReads.__annotations__) | {n for n in vars(StoreReads) if n[0] != "_"}
    assert listed == {"root", "clock", "topics", "queue_ids", "min_offset", "max_offset", "read",
                      "consumed_floor"}


@pytest.mark.loops("thread")
def test_cleanup_policy_declaring_reads_store_without_bind_is_refused_at_open(make_store,
                                                                             add_plugin):
    name = add_plugin("reading_policy", StoreReadingPolicyPlugin())
    with pytest.raises(PluginError) as info:
        make_store(with_modules(name, cleanup={"policy": "bindless"}))
    assert str(info.value) == ("cleanup policy 'bindless' declares capability 'reads_store' "
                               "but has no bind() method")
    # The failed open released the directory.
    assert make_store().put(Message("T", b"x", queue_id=0)).status is PutStatus.PUT_OK


def test_unknown_expression_type_fails_naming_it(make_store, demo_module):
    store = make_store(with_modules(demo_module))
    store.put(Message("T", b"x", tags="A", queue_id=0))
    store.wait_dispatched()
    with pytest.raises(PluginError) as info:
        store.get(GROUP, "T", 0, 0, 32, expression="A", expression_type="XPATH")
    message = str(info.value)
    assert "'XPATH'" in message
    listed = message.split("registered:", 1)[1]
    assert sorted(n.strip() for n in listed.split(",")) == ["REGEX", "SQL92", "TAG"]


class UnknownHookPlugin:
    @hookimpl
    def register_widgets(self, registry):
        registry.add("w", object)


class MisspelledHookPlugin:
    @hookimpl
    def after_apend(self, result):
        pass


@pytest.mark.parametrize("plugin, hook", [
    (UnknownHookPlugin(), "register_widgets"),
    (MisspelledHookPlugin(), "after_apend"),
])
def test_unknown_hook_fails_at_load(make_store, add_plugin, plugin, hook):
    name = add_plugin("bad_hook_plugin", plugin)
    with pytest.raises(PluginError, match=hook):
        make_plugin_manager(modules=[name], load_entry_points=False)
    with pytest.raises(PluginError, match=hook):
        make_store(with_modules(name))
    assert make_store().put(Message("T", b"x", queue_id=0)).status is PutStatus.PUT_OK


class WrongArgumentPlugin:
    @hookimpl
    def register_filters(self, registry, store):
        pass


def test_hookimpl_with_an_argument_the_hook_lacks_fails_at_load(add_plugin):
    name = add_plugin("wrong_argument_plugin", WrongArgumentPlugin())
    with pytest.raises(PluginError, match="register_filters"):
        make_plugin_manager(modules=[name], load_entry_points=False)


def test_builtin_hookimpls_are_all_trylast():
    pm = make_plugin_manager(load_entry_points=False)
    builtin_impls = [impl for caller in pm.hook.__dict__.values()
                     if isinstance(caller, pluggy.HookCaller)
                     for impl in caller.get_hookimpls() if impl.plugin_name in DEFAULT_PLUGINS]
    assert {impl.plugin_name for impl in builtin_impls} == set(DEFAULT_PLUGINS)
    assert [i.plugin_name for i in builtin_impls if not i.trylast] == []


class KeepFilter:
    """Matches bodies starting with ``keep``; no tag-code shortcut."""

    def __init__(self, expression, string_hash) -> None:
        self.expression = expression

    def match_units(self, tags_codes):
        return None

    def match_message(self, message) -> bool:
        return message.body.startswith(b"keep")


class QueueTwo:
    def __init__(self, config=None, string_hash=None) -> None:
        pass

    def select(self, message, queue_count: int) -> int:
        return 2


class OverridePlugin:
    @hookimpl
    def register_filters(self, registry):
        registry.add("tag", KeepFilter)  # the registry upper-cases filter names

    @hookimpl
    def register_queue_selectors(self, registry):
        registry.add("round_robin", QueueTwo)


def test_a_second_registration_of_a_builtin_name_is_refused_naming_both(make_store, add_plugin):
    # Keeping either silently would make "round_robin" mean different strategies depending
    # on which packages are installed.
    with pytest.raises(ConfigError) as caught:
        make_store(with_modules(add_plugin("override_plugin", OverridePlugin())))
    message = str(caught.value)
    assert "registered twice" in message
    assert "module override_plugin" in message
    assert ("module mqstore.plugins.filter_tag" in message
            or "module mqstore.plugins.queue_select_round_robin" in message), message


def test_a_second_registration_is_refused_whatever_the_order():
    pm = make_plugin_manager(load_entry_points=False)
    builtins = [(name, pm.unregister(name=name)) for name in DEFAULT_PLUGINS]
    pm.register(OverridePlugin(), "override_plugin")
    for name, module in builtins:
        pm.register(module, name)
    with pytest.raises(PluginError, match="registered twice") as caught:
        PluginHooks(pm)
    assert "override_plugin" in str(caught.value)


def test_disable_blocks_a_builtin_plugin(make_store, monkeypatch):
    with pytest.raises(PluginError, match="'random'"):
        make_store({"plugins": {"disable": ["mqstore.plugins.queue_select_random"]},
                    "queue_select": {"selector": "random"}})
    store = make_store({"queue_select": {"selector": "random"}})
    assert store.put(Message("T", b"x")).status is PutStatus.PUT_OK
    monkeypatch.setenv("MQSTORE_DISABLE_PLUGINS", "mqstore.plugins.queue_select_hash")
    pm = make_plugin_manager(load_entry_points=False)
    assert pm.is_blocked("mqstore.plugins.queue_select_hash")
    assert "key_hash" not in PluginHooks(pm).queue_selectors
    assert "random" in PluginHooks(pm).queue_selectors


class ShadowingDispatcherPlugin:
    @hookimpl
    def register_dispatchers(self, registry):
        registry.add("consume_queue", lambda view, role: None)


def test_consume_queue_building_cannot_be_disabled(tmp_path):
    with pytest.raises(ConfigError) as caught:
        MessageStore.open(tmp_path / "s", config=load_config(
            overrides={"plugins": {"disable": ["mqstore.plugins.cq_builder"]}}))
    message = str(caught.value)
    assert "'mqstore.plugins.cq_builder'" in message
    assert "consume queues are built by the core's dispatch" in message
    assert not any(tmp_path.iterdir())


def test_a_dispatcher_named_consume_queue_is_refused_at_open(add_plugin, make_store):
    with pytest.raises(ConfigError) as caught:
        make_store(with_modules(add_plugin("shadow", ShadowingDispatcherPlugin())))
    message = str(caught.value)
    assert "dispatcher name 'consume_queue' (registered by module shadow) is reserved" in message
    assert "the core's consume-queue builder" in message


def test_consume_queues_are_built_with_every_builtin_dispatcher_disabled(make_store):
    # The default configuration (worker processes): the dispatch worker builds the queues
    # from the core, whatever plugins it loads.
    store = make_store({"plugins": {"disable": ["mqstore.plugins.index_key"]}})
    put = store.put_batch([Message("T", b"m%d" % i, queue_id=0) for i in range(3)])
    assert put.status is PutStatus.PUT_OK and put.queue_offsets.tolist() == [0, 1, 2]
    store.wait_dispatched()
    got = store.get(GROUP, "T", 0, 0, 32)
    assert got.status is GetStatus.FOUND and [m.body for m in got.messages] == [b"m0", b"m1", b"m2"]


# -- the demo package's strategies, in stores with the default worker processes ----------------
#
# Each test runs a child interpreter with the pip-installed package on PYTHONPATH (as the tests
# at the top of this module) and a store in the default configuration: a dispatch worker process
# and a flush worker process, both building their own plugin manager from the entry point. The
# child prints one JSON line; the assertions are made here.

CHILD_PRELUDE = textwrap.dedent("""
    import json, os, sys, time
    from mqstore import Message, MessageBatch, MessageStore, load_config

    root = sys.argv[1]
    config = load_config(overrides=json.loads(sys.argv[2]))

    def wait_until(done, timeout=5.0):
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"not reached within {timeout} s")
            time.sleep(0.002)

    def modes(store):
        return [store.worker_status()["mode"], store.internals.flush_client.status()["mode"]]
""")


def run_child(site, root, script, overrides, *, env=None):
    """Run ``CHILD_PRELUDE + script`` with the installed package; its last stdout line, as JSON."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")}
    child_env["PYTHONPATH"] = str(site)
    child_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", CHILD_PRELUDE + textwrap.dedent(script), str(root),
         json.dumps(overrides)],
        capture_output=True, text=True, env=child_env, cwd=Path(root).parent, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


SELECTOR_SCRIPT = """
    with MessageStore.open(root, config) as store:
        singles = [store.put(Message("T", bytes([b]) + b"-single")) for b in (0, 5, 97, 255)]
        batch = store.put_batch([Message("T", bytes([b]) + b"-batch") for b in (2, 7, 8)])
        try:
            store.put(Message("T", b""))
            empty = "accepted"
        except ValueError as exc:
            empty = str(exc)
        store.wait_dispatched()
        queues = {q: [m.body[0] for m in store.get("G", "T", q, 0, 32).messages]
                  for q in range(4)}
        print(json.dumps({"modes": modes(store), "singles": [r.queue_id for r in singles],
                          "batch": batch.queue_ids.tolist(), "empty": empty,
                          "queues": queues}))
"""


def test_demo_queue_selector_places_messages_by_their_first_byte(demo_site, tmp_path):
    out = run_child(demo_site, tmp_path / "store", SELECTOR_SCRIPT,
                    {"queue_select": {"selector": "first_byte", "queues_per_topic": 4}})
    assert out["modes"] == ["process", "process"]
    assert out["singles"] == [0, 1, 1, 3]  # 0 % 4, 5 % 4, 97 % 4, 255 % 4
    assert out["batch"] == [2, 3, 0]
    assert out["queues"] == {"0": [0, 8], "1": [5, 97], "2": [2], "3": [255, 7]}
    assert "'first_byte' needs a non-empty body" in out["empty"]


WRITER_SCRIPT = """
    import mqstore_demo_plugin as demo

    S = config.commit_log.segment_bytes
    with MessageStore.open(root, config) as store:
        singles = []
        while not singles or singles[-1].phys_offset < S:  # into the second segment
            singles.append(store.put(Message("T", b"s" * 200, queue_id=0)))
        batch = store.put_batch([Message("T", b"b%d" % i, queue_id=0) for i in range(3)])
        store.wait_dispatched()
        got = store.get("G", "T", 0, 0, 32)
        print(json.dumps({"modes": modes(store), "written": demo.WRITTEN,
                          "singles": len(singles), "statuses": sorted(
                              {r.status.name for r in singles} | {batch.status.name}),
                          "record_bytes": sum(r.size for r in singles) + batch.wrote_bytes,
                          "got": len(got.messages), "last": got.messages[-1].body.decode()}))
"""


def test_demo_writer_copies_every_block_through_the_plain_writer_contract(demo_site, tmp_path):
    out = run_child(demo_site, tmp_path / "store", WRITER_SCRIPT,
                    {"writer": {"kind": "demo_counting"},
                     "commit_log": {"segment_bytes": SEGMENT_BYTES}})
    assert out["modes"] == ["process", "process"]
    assert out["statuses"] == ["PUT_OK"]
    # One copy per put and per put_batch, plus the blank closing the first segment; a roll
    # before each of the two segments.
    written = out["written"]
    assert written["writes"] == out["singles"] + 1 + 1
    assert written["rolls"] == 2
    assert written["bytes"] == out["record_bytes"] + 8  # the blank record's 8 bytes
    # What the plain writer copied is readable (and was dispatched) at once.
    assert out["got"] == out["singles"] + 3 and out["last"] == "b2"


TAG_COUNTER_PUTS = """
    import mqstore_demo_plugin as demo
    from mqstore.testing import simulate_crash

    out = {}
    store = MessageStore.open(root, config)
    out["modes"] = modes(store)
    out["store_process_dispatchers"] = sorted(type(d).__name__ for d in store.internals.dispatchers)
    # Every message has a key: the key index then resumes at the log's end after a clean
    # close (with no keyed message it asks for the whole log again at every open).
    store.put(Message("T", b"1", tags="red", keys="k1", queue_id=0))
    store.put(Message("T", b"2", tags="blue", keys="k2", queue_id=1))
    store.put(Message("T", b"3", tags="red", keys="k3", queue_id=0,
                      sysflag=0b0100))  # a prepared transaction half: not counted
    store.put_batch([Message("T", b"4", tags="red", keys="k4", queue_id=0),
                     Message("U", b"5", tags="red", keys="k5", queue_id=0),
                     Message("T", b"6", keys="k6", queue_id=0)])
    store.put_batch(MessageBatch("U", [b"7", b"8", b"9"], queue_ids=1,
                                 tags=["blue", None, "green"], keys=[["k7"], ["k8"], ["k9"]]))
    store.wait_dispatched()
    out["first"] = demo.read_tag_counts(root)
    out["end"] = store.max_phys_offset
"""

TAG_COUNTER_CRASH_SCRIPT = TAG_COUNTER_PUTS + """
    simulate_crash(store)  # workers killed, abort marker left: the reopen recovers
    store = MessageStore.open(root, config)
    store.wait_dispatched()
    out["redispatched"] = store.recovery_report.redispatch_bytes
    out["after_crash"] = demo.read_tag_counts(root)["tags"]
    store.put(Message("T", b"10", tags="green", queue_id=2))
    store.wait_dispatched()
    out["after_put"] = demo.read_tag_counts(root)["tags"]
    store.close()
    print(json.dumps(out))
"""

TAG_COUNTER_LOST_SCRIPT = TAG_COUNTER_PUTS + """
    from mqstore.testing import ManualScheduler

    store.close()
    os.remove(os.path.join(root, demo.TAG_COUNTS_FILE))
    scheduler = ManualScheduler()
    store = MessageStore.open(root, config, scheduler=scheduler)
    store.wait_dispatched()
    out["redispatched"] = store.recovery_report.redispatch_bytes
    # The store process waits for the position it published (its follower-role dispatchers'
    # resume offsets); the worker's re-dispatch below it for this writer-only counter is not
    # part of that wait: the derived files' pass writes the file down, until it holds all.
    path = os.path.join(root, demo.TAG_COUNTS_FILE)

    def rebuilt():
        scheduler.run("derived_flush")
        return os.path.exists(path) and demo.read_tag_counts(root)["next"] == out["end"]
    wait_until(rebuilt, timeout=60)
    out["rebuilt"] = demo.read_tag_counts(root)
    store.close()
    print(json.dumps(out))
"""

FIRST_COUNTS = {"blue": 2, "green": 1, "red": 3}


def check_first_counts(out):
    assert out["modes"] == ["process", "process"]
    # The store process follows (role "follower"): the counter is built in the worker only.
    assert "KeyIndex" in out["store_process_dispatchers"]
    assert "TagCounter" not in out["store_process_dispatchers"]
    assert out["first"]["tags"] == FIRST_COUNTS
    assert out["first"]["next"] == out["end"]


def test_demo_dispatcher_counts_tags_in_the_dispatch_worker(demo_site, tmp_path):
    out = run_child(demo_site, tmp_path / "store", TAG_COUNTER_CRASH_SCRIPT, {})
    check_first_counts(out)
    # Recovery handed every record to the dispatchers again; none was counted twice.
    assert out["redispatched"] == out["end"]
    assert out["after_crash"] == FIRST_COUNTS
    assert out["after_put"] == {"blue": 2, "green": 2, "red": 3}


def test_demo_dispatcher_rebuilds_lost_counts_through_resumes(demo_site, tmp_path):
    out = run_child(demo_site, tmp_path / "store", TAG_COUNTER_LOST_SCRIPT, {})
    check_first_counts(out)
    # A clean reopen re-dispatches nothing by itself; the counter, finding no file, answered
    # resume_offset() 0, so the dispatch worker started again at the first record.
    assert out["redispatched"] == 0
    assert out["rebuilt"]["tags"] == FIRST_COUNTS
    assert out["rebuilt"]["next"] == out["end"]


FLUSH_SCRIPT = """
    from mqstore.testing import ManualScheduler
    scheduler = ManualScheduler()
    with MessageStore.open(root, config, scheduler=scheduler) as store:
        status = store.internals.flush_client.status
        before = status()
        store.put_batch([Message("T", b"x" * 100, queue_id=0) for _ in range(3)])
        end = store.max_phys_offset
        # One flush interval on the scheduler's clock (far from the thorough pass's 10 s).
        scheduler.run("flush", seconds=config.flush.interval_ms / 1000)
        after = status()
        print(json.dumps({"modes": modes(store), "end": end,
                          "fsyncs": [before["fsyncs"], after["fsyncs"]],
                          "flushed": [before["flushed"], after["flushed"]]}))
"""


@pytest.mark.parametrize("policy", ["every_interval", "async"])
def test_demo_flush_policy_forces_whatever_is_pending_every_interval(demo_site, tmp_path, policy):
    out = run_child(demo_site, tmp_path / "store", FLUSH_SCRIPT,
                    {"flush": {"policy": policy, "interval_ms": 20}})
    assert out["modes"] == ["process", "process"]
    assert out["end"] > 0
    if policy == "every_interval":  # one pass forced the three records; no flush was asked for
        assert out["flushed"] == [0, out["end"]]
        assert out["fsyncs"][1] == out["fsyncs"][0] + 1
    else:  # async waits for flush.least_pages (4) dirty pages or the 10 s thorough pass
        assert out["flushed"] == [0, 0]
        assert out["fsyncs"][1] == out["fsyncs"][0]


SEGMENT_BYTES = 4096

CLEANUP_SCRIPT = """
    import mqstore.runtime.cleanup
    from mqstore.clock import ManualClock
    from mqstore.testing import ManualScheduler

    # Age decides here, not disk pressure (a busy machine's disk may pass the forcibly ratio).
    mqstore.runtime.cleanup.disk_used_ratio = lambda path: 0.5

    S = config.commit_log.segment_bytes
    clock = ManualClock()
    scheduler = ManualScheduler()  # the cleanup job runs when this script says so
    out = {"modes": None, "first_queue_offset": {}}
    store = MessageStore.open(root, config, clock=clock, scheduler=scheduler)
    out["modes"] = modes(store)

    def put_until(segment):
        # Puts at the current time; the last one is the first record of ``segment``.
        while True:
            r = store.put(Message("T", b"m" * 200, queue_id=0))
            assert r.status.name == "PUT_OK", r
            out["first_queue_offset"].setdefault(r.phys_offset // S, r.queue_offset)
            if r.phys_offset // S == segment:
                return

    put_until(1)            # segment 0, and the first record of 1, at t0
    clock.advance(40_000)
    put_until(3)            # the rest of 1, all of 2, the first record of 3, at t0 + 40 s
    store.wait_dispatched()
    scheduler.run("cleanup")  # nothing is 60 s old yet
    out["min"] = [store.min_phys_offset]
    out["queue_min"] = [store.min_offset("T", 0)]
    clock.advance(30_000)   # t0 + 70 s: only segment 0 is older than 60 s (1 starts at t0)
    scheduler.run("cleanup")
    out["min"].append(store.min_phys_offset)
    out["queue_min"].append(store.min_offset("T", 0))
    clock.advance(40_000)   # t0 + 110 s: 1 and 2 too (2 and 3 start at t0 + 40 s)
    scheduler.run("cleanup")
    out["min"].append(store.min_phys_offset)
    out["queue_min"].append(store.min_offset("T", 0))
    out["segments"] = sorted(os.listdir(os.path.join(root, "commitlog")))
    store.close()
    print(json.dumps(out))
"""


def test_demo_cleanup_policy_deletes_segments_older_than_the_max_age(demo_site, tmp_path):
    out = run_child(demo_site, tmp_path / "store", CLEANUP_SCRIPT,
                    {"commit_log": {"segment_bytes": SEGMENT_BYTES},
                     "cleanup": {"policy": "max_age", "interval_ms": 1}},
                    env={"MQSTORE_DEMO_MAX_AGE_MS": "60000"})
    assert out["modes"] == ["process", "process"]
    first = {int(k): v for k, v in out["first_queue_offset"].items()}
    assert sorted(first) == [0, 1, 2, 3] and first[0] == 0
    assert out["min"] == [0, SEGMENT_BYTES, 3 * SEGMENT_BYTES]
    assert out["queue_min"] == [0, first[1], first[3]]
    assert out["segments"] == [f"{3 * SEGMENT_BYTES:020d}"]


def test_demo_cleanup_policy_decisions(demo_module, monkeypatch):
    from mqstore import load_config
    from mqstore.plugin_api.contracts import CleanupDecision

    demo = importlib.import_module(demo_module)
    config = load_config(overrides={"plugins": {"load_entry_points": False},
                                    "cleanup": {"file_reserved_hours": 2}})
    monkeypatch.delenv(demo.MAX_AGE_ENV, raising=False)
    assert demo.MaxAgeCleanup(config).max_age_ms == 2 * 3_600_000
    monkeypatch.setenv(demo.MAX_AGE_ENV, "60000")
    policy = demo.MaxAgeCleanup(config)  # warning ratio 90 %, forcibly 85 % (the defaults)
    now = 1_700_000_000_000
    assert policy.decide(now, 0.50) == CleanupDecision(True, 60_000, False)
    assert policy.decide(now, 0.88) == CleanupDecision(True, 0, None)
    assert policy.decide(now, 0.95) == CleanupDecision(True, 0, True)
    assert policy.decide(now, -1.0) == CleanupDecision(True, 60_000, None)
    gentle = demo.MaxAgeCleanup(config.replace(cleanup={"clean_forcibly": False}))
    assert gentle.decide(now, 0.95) == CleanupDecision(True, 60_000, True)
    for bad in ("abc", "0"):
        monkeypatch.setenv(demo.MAX_AGE_ENV, bad)
        with pytest.raises(ValueError, match=demo.MAX_AGE_ENV):
            demo.MaxAgeCleanup(config)


# -- contracts enforced at build time, cleanup's promise to after_cleanup --------------------

@pytest.mark.loops("thread")  # the plugin object lives in this process only
def test_a_capability_declared_without_its_method_is_refused(make_store, add_plugin):
    class Boasting:
        capabilities = frozenset({"looks_up_keys"})

        def __init__(self, view, role):
            pass

        def dispatch(self, batch):
            pass

        def close(self):
            pass

    class Plugin:
        @hookimpl
        def register_dispatchers(self, registry):
            registry.add("boasting", Boasting)

    name = add_plugin("boasting_dispatcher_plugin", Plugin())
    with pytest.raises(PluginError, match="dispatcher 'boasting' declares capability "
                                          "'looks_up_keys' but has no candidates\\(\\) method"):
        make_store(with_modules(name))


AFTER_CLEANUP_PLUGIN = '''
import json, os
from mqstore import hookimpl

ROOT = os.environ["CLEANUP_PROBE_ROOT"]


@hookimpl
def after_cleanup(min_phys_offset):
    # What this hook sees of the derived files, in the process that runs it.
    index = sorted(os.listdir(os.path.join(ROOT, "index")))
    queue = sorted(os.listdir(os.path.join(ROOT, "consumequeue", "T", "0")))
    with open(os.path.join(ROOT, "after_cleanup.json"), "w") as f:
        json.dump({"min": min_phys_offset, "pid": os.getpid(), "index": index,
                   "queue": queue}, f)
'''


def test_after_cleanup_runs_once_the_derived_files_are_dropped(make_store, store_dir, tmp_path,
                                                               monkeypatch):
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    (plugin_dir / "cleanup_probe_plugin.py").write_text(AFTER_CLEANUP_PLUGIN)
    monkeypatch.syspath_prepend(str(plugin_dir))  # the dispatch worker imports it too
    monkeypatch.setenv("CLEANUP_PROBE_ROOT", str(store_dir))
    store = make_store({**with_modules("cleanup_probe_plugin"),
                        "commit_log": {"segment_bytes": 4096},
                        "consume_queue": {"file_units": 16},
                        "index": {"max_hash_slots": 4, "max_index_entries": 6}})
    for i in range(120):
        assert store.put(Message("T", b"y" * 200, keys=[f"k{i}"], queue_id=0)).status \
            is PutStatus.PUT_OK
    store.wait_dispatched()
    index_before = sorted(os.listdir(store_dir / "index"))
    queue_before = sorted(os.listdir(store_dir / "consumequeue" / "T" / "0"))

    removed = store.delete_expired_segments(force=True, max_segments=3)

    assert len(removed) == 3
    seen = json.loads((store_dir / "after_cleanup.json").read_text())  # written before return
    assert seen["min"] == store.min_phys_offset == 3 * 4096
    assert seen["pid"] == store.worker_status()["pid"]  # the dispatch loop's process
    # The hook saw the files as they are now: the old ones were already gone.
    assert seen["index"] == sorted(os.listdir(store_dir / "index")) != index_before
    assert seen["queue"] == sorted(os.listdir(store_dir / "consumequeue" / "T" / "0"))
    assert seen["queue"] != queue_before
