"""Opportunistic entitlements (issue #37): `kind` fixed at creation, `notice` bounded and
changeable; bad input named and nothing written."""

from __future__ import annotations

from tests.controlplane.controld_proc import daemon_with_sim_agents


def test_an_opportunistic_entitlement_is_created_shown_and_its_notice_changed(tmp_path, etcd_server):
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("h1",), heartbeat_timeout=2.0) as (c, _agents):
        base = {"machine_type": "generic", "quota": 2}
        for body, field, words in [({"kind": "spot"}, "kind", "'spot'"),
                                   ({"kind": "opportunistic", "notice": -1}, "notice", ">= 0"),
                                   ({"kind": "opportunistic", "notice": 7200}, "notice", "<= 3600")]:
            status, e = c.call("POST", "/v1/entitlements", {"name": "batch", **base, **body})
            assert (status, e["field"]) == (400, field) and words in e["why"], e
        assert c.call("GET", "/v1/entitlements/batch")[0] == 404, "a refused entitlement wrote nothing"

        status, e = c.call("POST", "/v1/entitlements", {"name": "batch", **base, "kind": "opportunistic", "notice": 30})
        assert status == 201 and (e["kind"], e["notice"]) == ("opportunistic", 30.0), e
        status, e = c.call("POST", "/v1/entitlements", {"name": "web", **base})
        assert status == 201 and (e["kind"], e["notice"]) == ("guaranteed", 120.0), e

        status, e = c.call("PATCH", "/v1/entitlements/batch", {"kind": "guaranteed", "notice": 60})
        assert status == 400 and e["field"] == "kind", e  # fixed at creation: no field of a change
        assert c.call("GET", "/v1/entitlements/batch")[1]["notice"] == 30.0, "a refused change wrote nothing"
        status, e = c.call("PATCH", "/v1/entitlements/batch", {"notice": 60})
        assert status == 200 and (e["kind"], e["notice"]) == ("opportunistic", 60.0), e
        kinds = {x["name"]: x["kind"] for x in c.call("GET", "/v1/entitlements")[1]["entitlements"]}
        assert kinds == {"batch": "opportunistic", "web": "guaranteed"}
