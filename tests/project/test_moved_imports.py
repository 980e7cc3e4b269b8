"""Import paths that moved to the layer packages keep working for one release, with a
DeprecationWarning naming the new path; the suite itself uses only the new paths (pyproject's
filterwarnings turns that warning into an error everywhere else)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from mqstore._moved import MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_import_path_warns_and_gives_the_new_module(old, new):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        f"{old} moved to {new}; the old import path goes in the next release"]
    sys.modules.pop(old, None)


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
        "warned mqstore.hookspecs moved to mqstore.plugin_api.hookspecs; the old import path "
        "goes in the next release",
        "True True StoreView"]
