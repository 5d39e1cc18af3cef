"""Growing a region's etcd by a member (issue #24: a new control host joins the cluster): real etcd
processes with TLS to clients and peers and etcd's auth on, the admin's certificate telling the
cluster of the new member (controlplane/store/members.py), the new member starting with the
cluster it was given, and the data written before it joined there."""

from __future__ import annotations

import asyncio
import time

import grpc

from controlplane.security.etcdauth import enable
from controlplane.security.pki import CA
from controlplane.store import members
from controlplane.store.etcdtls import EtcdTls
from controlplane.store.etcdproc import EtcdServer
from tests.etcd_server import kv_as


def test_a_member_joins_a_running_cluster_and_has_its_data(tmp_path):
    ca = CA(tmp_path / "pki")
    pairs = {n: ca.issue(n, ips=(ip,)) for n, ip in (("etcd-1", "127.0.0.11"), ("etcd-2", "127.0.0.12"))}
    root = ca.issue("root", server=False)
    admin = EtcdTls.load(str(ca.cert), str(root.cert), str(root.key))

    def server(name: str, host: str) -> EtcdServer:
        tls = (pairs[name].cert, pairs[name].key, ca.cert)
        return EtcdServer(host, data_dir=tmp_path / name, name=name, tls=tls, peer_tls=tls)

    first = server("etcd-1", "127.0.0.11").start()
    second = server("etcd-2", "127.0.0.12")
    try:
        asyncio.run(enable(first.endpoint, admin, "controld"))
        assert kv_as(first.endpoint, ca.cert, root, b"/twine/kept", b"before") == []
        cluster = asyncio.run(members.add(first.endpoint, "etcd-2", second.peer_url, admin))
        assert cluster == f"etcd-1={first.peer_url},etcd-2={second.peer_url}", cluster
        listed = asyncio.run(members.members(first.endpoint, admin))
        assert sorted(m.name for m in listed) == ["", "etcd-1"], "added, not started yet"
        second.initial_cluster, second.initial_state = cluster, "existing"
        second.cluster_token = first.cluster_token
        second.start()
        assert kv_as(second.endpoint, ca.cert, root, b"/twine/kept") == [b"before"], "it has what was written before"
        assert sorted(m.name for m in asyncio.run(members.members(second.endpoint, admin))) == ["etcd-1", "etcd-2"]
        assert first.status()["leader"] == second.status()["leader"] != 0
        for _ in range(100):  # etcd takes a member out once it has been in touch with the others a while
            try:
                gone = asyncio.run(members.remove(first.endpoint, "etcd-2", admin))
                break
            except grpc.aio.AioRpcError as e:
                assert "unhealthy cluster" in (e.details() or ""), e
                time.sleep(0.2)
        assert gone.name == "etcd-2"
        assert [m.name for m in asyncio.run(members.members(first.endpoint, admin))] == ["etcd-1"]
    finally:
        second.stop()
        first.stop()


def test_an_unknown_member_or_a_bad_url_is_refused_naming_it(tmp_path, capsys):
    first = EtcdServer(name="solo").start()
    try:
        assert members.main(["--endpoint", first.endpoint, "add", "x", "ftp://nowhere"]) == 2
        assert "PEER_URL" in (err := capsys.readouterr().err) and "ftp://nowhere" in err, err
        assert members.main(["--endpoint", first.endpoint, "remove", "nobody"]) == 2
        assert "NAME" in (err := capsys.readouterr().err) and "nobody" in err and "no such member" in err, err
        assert members.main(["--endpoint", first.endpoint, "list"]) == 0
        assert " solo peers=" in capsys.readouterr().out
    finally:
        first.stop()


def test_status_names_the_leader_and_move_leader_hands_it_over_and_a_member_down_fails_it(capsys):
    from controlplane.store.etcdproc import EtcdCluster

    cluster = EtcdCluster(3).start()
    try:
        first = cluster.members[0].endpoint

        said = {}

        def status() -> tuple[int, dict[str, str]]:
            code = members.main(["--endpoint", first, "status"])
            out = capsys.readouterr()
            said["err"] = out.err
            return code, {line.split()[0]: line.split()[1] for line in out.out.splitlines()}

        code, roles = status()
        assert code == 0 and sorted(roles.values()) == ["follower", "follower", "leader"], roles
        target = next(name for name, role in roles.items() if role == "follower" and name != "test-1")
        assert members.main(["--endpoint", first, "move-leader", target]) == 0
        assert capsys.readouterr().out.strip().endswith(f" {target}")
        code, roles = status()
        assert code == 0 and roles[target] == "leader", roles
        assert members.main(["--endpoint", first, "move-leader", "nobody"]) == 2
        assert "no such member" in capsys.readouterr().err

        assert members.main(["--endpoint", first, "defrag"]) == 0
        assert sorted(line.split()[-1] for line in capsys.readouterr().out.splitlines()) == ["test-1", "test-2", "test-3"]

        cluster.members[2].halt()
        code, roles = status()
        assert code == 3 and roles["test-3"] == "unreachable", roles
        assert "not every member answers" in said["err"]
    finally:
        cluster.stop()
