"""``mqstore role`` on a store directory, as a real process: what a closed store's next start
takes up (``role.json``), exact JSON and exit codes. Through ``--server`` it runs in the
failover tests (``tests/replication/test_failover.py``)."""

from __future__ import annotations

import pytest

from cli_support import SMALL_CONFIG, error_line, mqstore, mqstore_json

pytestmark = pytest.mark.usefixtures("no_plugin_env")


@pytest.fixture
def slave_config(tmp_path):
    path = tmp_path / "slave.yaml"
    path.write_text(SMALL_CONFIG + "store: {role: slave}\n"
                    "server: {ha_master: '127.0.0.1:10912'}\n")
    return str(path)


def test_role_status_promote_and_demote_on_a_closed_store(tmp_path, slave_config):
    root = tmp_path / "store"
    mqstore("init", root, "-c", slave_config)
    status = mqstore_json("role", "status", root, "-c", slave_config)
    assert {k: status[k] for k in ("role", "master", "configured_role", "recorded", "epoch",
                                   "epochs", "problems")} == {
        "role": "slave", "master": "127.0.0.1:10912", "configured_role": "slave",
        "recorded": None, "epoch": 0, "epochs": [], "problems": []}

    promoted = mqstore_json("role", "promote", root, "-c", slave_config)
    assert promoted == {"role": "async_master", "epoch": 1, "start_offset": 0,
                        "followed": "127.0.0.1:10912", "lacked": None, "forced": False,
                        "mirror": None}
    status = mqstore_json("role", "status", root, "-c", slave_config)
    assert (status["role"], status["configured_role"], status["epochs"]) == (
        "async_master", "slave", [[1, 0]])
    assert status["recorded"]["why"] == "promoted from slave of 127.0.0.1:10912"
    assert (root / "epochFileCheckpoint").read_text() == "1\n1725254278\n1-0\n"

    again = mqstore("role", "promote", root, "-c", slave_config, check=2)
    assert error_line(again) == ("Error: this store is async_master already (epoch 1); only an "
                                 "election's newer epoch promotes it again")

    demoted = mqstore_json("role", "demote", root, "--master", "127.0.0.1:20912",
                           "-c", slave_config)
    assert demoted == {"role": "slave", "master": "127.0.0.1:20912", "was": "async_master"}
    assert mqstore_json("role", "status", root, "-c", slave_config)["master"] == \
        "127.0.0.1:20912"
    bad = mqstore("role", "demote", root, "--master", "127.0.0.1:0", "-c", slave_config,
                  check=2)
    assert error_line(bad) == ("Error: master address '127.0.0.1:0': port 0 cannot be "
                               "dialled")
