"""mqstore's build backend: setuptools' own, plus Spark discovery in editable installs.

Spark finds the ``pyspark_mqstore`` module (its data-source discovery) with
``pkgutil.iter_modules()``, which lists only modules that sit in a ``sys.path`` directory. A
regular wheel installs ``pyspark_mqstore.py`` into site-packages. An editable install of this
project does not: ``mqstore`` lives in ``core/``, so setuptools serves every module through an
import hook, which imports fine but which ``iter_modules()`` never lists. ``build_editable``
therefore adds a copy of that four-line module to the editable wheel (so it lands in
site-packages like a regular install's); everything else is setuptools' unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - every other hook, as setuptools has it

DISCOVERY_MODULE = "pyspark_mqstore.py"


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    with open(DISCOVERY_MODULE, "rb") as f:  # the build runs in the project's directory
        _add_to_wheel(os.path.join(wheel_directory, name), DISCOVERY_MODULE, f.read())
    return name


def _add_to_wheel(wheel: str, arcname: str, data: bytes) -> None:
    """Rewrite ``wheel`` with ``arcname`` added at its root and listed in its RECORD."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(wheel) as src:
        entries = [(info, src.read(info)) for info in src.infolist()]
    tmp = wheel + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr(arcname, data)
        for info, content in entries:
            if info.filename.endswith(".dist-info/RECORD"):
                content += f"{arcname},sha256={digest},{len(data)}\n".encode()
            out.writestr(info, content)
    os.replace(tmp, wheel)
