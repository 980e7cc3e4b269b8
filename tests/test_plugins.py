"""Plugins: a real third-party package found through its entry point, and class plugins in-process.

The third-party package is ``tests/plugin_pkg``: it is pip-installed into a temporary directory
and a fresh interpreter opens a store with that directory on ``PYTHONPATH``. In-process plugins
are class instances placed in ``sys.modules`` under a module name and named in
``plugins.modules``, exactly as a plugin module would be.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pluggy
import pytest

from mqstore import GetStatus, Message, PutStatus, hookimpl
from mqstore.errors import PluginError
from mqstore.plugins_manager import DEFAULT_PLUGINS, PluginHooks, make_plugin_manager

PLUGIN_PKG = Path(__file__).resolve().parent / "plugin_pkg"
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
        registry.add("recorder", lambda store: _RecordingDispatcher(self))

    @hookimpl
    def after_dispatch(self, batch):
        self.after.append(batch)


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

    def make_writer(self, commit_log, config):
        self.made += 1
        plugin = self

        class CountingWriter:
            def write(self, segment, data):
                plugin.writes.append(len(data))
                return segment.write(data)

        return CountingWriter()


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


def test_third_party_registration_of_a_builtin_name_wins(make_store, add_plugin):
    store = make_store(with_modules(add_plugin("override_plugin", OverridePlugin())))
    puts = [store.put(Message("T", body, tags="A")) for body in (b"keep-1", b"drop", b"keep-2")]
    assert [r.queue_id for r in puts] == [2, 2, 2]
    store.wait_dispatched()
    r = store.get(GROUP, "T", 2, 0, 32, expression="A", expression_type="TAG")
    assert [m.body for m in r.messages] == [b"keep-1", b"keep-2"]


def test_third_party_wins_even_when_registered_before_the_builtins():
    # Only trylast on the built-ins lets the plugin win here: pluggy otherwise calls the
    # later-registered implementation first, and the first registration of a name wins.
    pm = make_plugin_manager(load_entry_points=False)
    builtins = [(name, pm.unregister(name=name)) for name in DEFAULT_PLUGINS]
    pm.register(OverridePlugin(), "override_plugin")
    for name, module in builtins:
        pm.register(module, name)
    hooks = PluginHooks(pm)
    assert hooks.filters.owner("TAG") == "override_plugin"
    assert hooks.filters.get("TAG") is KeepFilter
    assert hooks.queue_selectors.get("round_robin") is QueueTwo
    assert hooks.queue_selectors.owner("random") == "mqstore.plugins.queue_select_random"


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
