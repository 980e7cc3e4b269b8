"""Import paths that moved to the layer packages keep working for one release, with a
DeprecationWarning naming the new path; the suite itself uses only the new paths (pyproject's
filterwarnings turns that warning into an error everywhere else)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from mqstore._moved import MOVED, MOVED_NAMES, REMOVED_IN


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_import_path_warns_and_gives_the_new_module(old, new):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        f"{old} moved to {new}; the old path goes in mqstore {REMOVED_IN}"]
    sys.modules.pop(old, None)


@pytest.mark.parametrize("module, name, new", sorted((m, n, new) for (m, n), new
                                                     in MOVED_NAMES.items()))
def test_a_name_moved_out_of_a_module_warns_and_gives_the_new_value(module, name, new):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(importlib.import_module(module), name)
    assert value is getattr(importlib.import_module(new), name)
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        f"{module}.{name} moved to {new}.{name}; the old path goes in mqstore {REMOVED_IN}"]
    assert caught[0].filename == __file__  # the warning points at the caller


def test_an_unknown_name_of_such_a_module_is_still_an_attribute_error():
    from mqstore.storage import checkpoint
    with pytest.raises(AttributeError, match="'mqstore.storage.checkpoint' has no attribute "
                                             "'no_such_name'"):
        checkpoint.no_such_name


def test_the_removal_release_is_the_next_minor_after_this_one():
    import tomllib
    from paths import REPO
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    major, minor, _patch = (int(p) for p in version.split("."))
    assert REMOVED_IN == f"{major}.{minor + 1}.0"
    import mqstore
    assert mqstore.__version__ == version


def test_from_the_package_face_and_a_moved_package_submodule():
    program = (
        "import warnings; warnings.simplefilter('error')\n"
        "try:\n"
        "    from mqstore import hookspecs\n"
        "except DeprecationWarning as exc:\n"
        "    print('warned', exc)\n"
        "warnings.simplefilter('ignore')\n"
        "from mqstore import hookspecs, contracts\n"
        "from mqstore.workers.shm import Channels\n"
        "import mqstore.runtime.workers.shm as shm\n"
        "import mqstore.plugin_api.hookspecs as new\n"
        "print(hookspecs is new, Channels is shm.Channels, contracts.StoreView.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"warned mqstore.hookspecs moved to mqstore.plugin_api.hookspecs; the old path goes "
        f"in mqstore {REMOVED_IN}",
        "True True StoreView"]


FACADE_INTERNALS = ["commit_log", "dispatchers", "hooks", "flush_client", "writer",
                    "supervisor", "channels"]


@pytest.mark.loops("thread")
def test_the_facades_internal_names_warn_and_give_the_internals(make_store):
    store = make_store()
    for name in FACADE_INTERNALS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(store, name)
        assert value is getattr(store.internals, name), name
        assert [str(w.message) for w in caught] == [
            f"MessageStore.{name} is internal: use MessageStore.internals.{name}; the old "
            f"name goes in mqstore {REMOVED_IN}"]
        assert caught[0].filename == __file__
    assert store.internals.commit_log.max_offset == store.max_phys_offset
    assert store.internals.supervisor is None  # dispatch runs on a thread here
    assert store.internals.flush_client is not None and store.internals.writer is not None
