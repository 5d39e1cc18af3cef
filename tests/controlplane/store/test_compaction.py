"""etcd's history is bounded: every etcd we start (the dev region's, the tests') compacts itself,
keeping an hour of versions, as the installers' etcd does (ETCD_AUTO_COMPACTION_* in
/etc/default/etcd, checked in the VM region). What etcd says it runs with, read from its own log."""

from __future__ import annotations

import json

import pytest

from controlplane.store.etcdproc import EtcdServer


@pytest.mark.parametrize("raised_limits", [True, False])
def test_our_etcd_runs_with_periodic_compaction_of_an_hour(tmp_path, raised_limits):
    etcd = EtcdServer(log_file=tmp_path / "etcd.log", log_level="info", raised_limits=raised_limits).start()
    try:
        lines = [json.loads(line) for line in (tmp_path / "etcd.log").read_text().splitlines() if line.startswith("{")]
    finally:
        etcd.stop()
    [started] = [line for line in lines if line.get("msg") == "starting an etcd server"]
    assert (started["auto-compaction-mode"], started["auto-compaction-retention"]) == ("periodic", "1h0m0s")
