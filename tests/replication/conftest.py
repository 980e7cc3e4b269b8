"""The replication tests' processes, and certificates for replication over TLS."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import signal

import pytest

from failover_support import Node
from replication_procs import kill_all


@pytest.fixture
def procs():
    """Every process a test starts (``replication_procs.Master``, ``Slave``) is gone when it
    ends, whatever happened."""
    started: list = []
    yield started
    kill_all(started)


@pytest.fixture
def nodes():
    """Every ``failover_support.Node`` a test starts is gone when it ends (a stopped one is
    continued first, so it dies at once)."""
    started: list[Node] = []
    yield started
    for node in started:
        if node.served is not None and node.served.proc.poll() is None:
            node.signal(signal.SIGCONT)
        node.kill()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    key, cert = d / f"{name}.key", d / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj",
             f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def _leaf(d: Path, name: str, serial: int, ca: tuple[Path, Path]) -> dict:
    key, csr, cert, ext = (d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem",
                           d / f"{name}.ext")
    ext.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-set_serial", str(serial), "-out", str(cert), "-days", "2",
             "-extfile", str(ext))
    return {"ha_tls_cert_file": str(cert), "ha_tls_key_file": str(key),
            "ha_tls_ca_file": str(ca[0])}


@pytest.fixture(scope="session")
def ha_certs(tmp_path_factory):
    """``server`` keys for TLS: ``master`` and ``slave`` signed by one CA (certificates for
    127.0.0.1), ``rogue`` by another CA that the first two do not trust."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    d = tmp_path_factory.mktemp("ha-certs")
    ca, other = _ca(d, "ha-ca"), _ca(d, "rogue-ca")
    return {"master": _leaf(d, "master", 1, ca), "slave": _leaf(d, "slave", 2, ca),
            "rogue": _leaf(d, "rogue", 3, other)}
