"""The ``coordination`` config section: off by default, names and endpoints checked, the timing
rule refused naming its keys; the settings the package takes from it; the missing extra."""

from __future__ import annotations

import pytest

from mqstore.config import load_config
from mqstore.coordination import CoordinationSettings
from mqstore.coordination import etcd as etcd_module
from mqstore.errors import ConfigError, CoordinationError

ON = {"etcd_endpoints": ["127.0.0.1:2379", "10.0.0.2:2379"], "node": "broker-a.1"}


def test_off_by_default_and_on_with_endpoints_and_a_node():
    assert load_config().coordination.etcd_endpoints == ()
    section = load_config(overrides={"coordination": ON}).coordination
    settings = CoordinationSettings.of(section)
    assert settings == CoordinationSettings(
        endpoints=("127.0.0.1:2379", "10.0.0.2:2379"), cluster="mqstore", node="broker-a.1",
        ttl_s=5, renew_s=1.0, retry_s=1.5, margin_s=1.0, priority=1, max_lag_bytes=0)


@pytest.mark.parametrize("changes, needle", [
    ({"node": None}, "coordination.node is not set but coordination.etcd_endpoints is"),
    ({"node": "a/b"}, "coordination.node: Value error, node 'a/b' must be 1 to 64 letters"),
    ({"cluster": "-x"}, "coordination.cluster: Value error, cluster '-x' must be 1 to 64"),
    ({"etcd_endpoints": ["127.0.0.1:0"]}, "etcd endpoint '127.0.0.1:0': port 0 cannot be"),
    ({"etcd_endpoints": ["localhost"]}, "listen address 'localhost' must be 'host:port'"),
    ({"lease_ttl_s": 1}, "coordination.lease_ttl_s: Input should be greater than or equal to 2"),
    ({"lease_ttl_s": 2}, "coordination.renew_interval_ms (1000) + 2 * "
                         "coordination.retry_timeout_ms (1500) = 4000 must not exceed "
                         "coordination.lease_ttl_s (2 s) - coordination.safety_margin_ms "
                         "(1000) = 1000 ms"),
    ({"retry_timeout_ms": 2000}, "= 5000 must not exceed"),
    ({"priority": -1}, "coordination.priority: Input should be greater than or equal to 0"),
])
def test_bad_values_are_refused_naming_the_keys(changes, needle):
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"coordination": {**ON, **changes}})
    assert needle in str(err.value)


def test_the_timing_rule_at_its_edge_loads():
    section = load_config(overrides={"coordination": {
        **ON, "lease_ttl_s": 2, "renew_interval_ms": 200, "retry_timeout_ms": 400,
        "safety_margin_ms": 1000}}).coordination
    assert section.renew_interval_ms + 2 * section.retry_timeout_ms == 1000


def test_without_the_ha_extra_the_client_says_what_to_install(monkeypatch):
    monkeypatch.setattr(etcd_module, "_MISSING", ImportError("No module named 'etcd3gw'"))
    with pytest.raises(CoordinationError, match=r"needs the ha extra \(pip install "
                                                r"'mqstore\[ha\]'\): No module named"):
        etcd_module.EtcdClient(["127.0.0.1:2379"], 1.0)
