"""The OpenAPI 3.1 document of the /v1 API, served at /v1/openapi.json (docs/api.md is its prose).

The bodies' and the answers' schemas are generated from controlplane/frontend/schema.py: the types the
daemon checks every body against, and those its answers hold. Schemathesis runs against the
served document in tests/controlplane/frontend/test_api_fuzz.py."""

from __future__ import annotations

import re
from functools import cache

from controlplane.capacity import slo
from controlplane.frontend import schema as schemas_of
from controlplane.frontend import usage
from controlplane.usage import peers
from controlplane.store.records import NAME


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict) -> dict:
    return {"content": {"application/json": {"schema": schema}}}


ERRORS = {
    "400": {"description": "invalid input; names the field", **_json(_ref("Error"))},
    "401": {"description": "missing or invalid token", **_json(_ref("Error"))},
    "403": {"description": "the token's role does not allow it; names the permission missing", **_json(_ref("Error"))},
    "404": {"description": "unknown entitlement, job, machine, token or maintenance", **_json(_ref("Error"))},
    "408": {"description": "the body did not arrive within --body-timeout", **_json(_ref("Error"))},
    "409": {"description": "exists, or lost a race with another change", **_json(_ref("Error"))},
    "413": {"description": "a body over the limit (1 MiB)", **_json(_ref("Error"))},
    "422": {"description": "valid, but not possible in the region as it is (quota, no machine fits, no such "
                   "machine, times that do not add up); names the field", **_json(_ref("Error"))},
    "503": {"description": "etcd unreachable (why names it), a transaction over etcd's limits, no leader, or "
                   "a connection over the limits", **_json(_ref("Error"))},
}
# On an answer from the daemon's view while etcd is unreachable (docs/api.md, "When etcd is unreachable").
STALE = {"X-Twine-Stale": {"description": "why this answer may be behind etcd", "schema": {"type": "string"}}}


def _op(summary: str, ok: str, schema: str | None = None, body: str | None = None, status: str = "200",
        security: str = "apiToken") -> dict:
    op: dict = {"summary": summary, "security": [{security: []}],
                "responses": {status: {"description": ok, "headers": STALE, **(_json(_ref(schema)) if schema else {})},
                              **ERRORS}}
    if body:
        op["requestBody"] = {"required": True, **_json(_ref(body))}
    return op


PATHS = {
    "/v1/entitlements": {
        "post": _op("create an entitlement", "created", "Entitlement", "EntitlementSpec", "201"),
        "get": _op("list entitlements", "the entitlements", "EntitlementList"),
    },
    "/v1/entitlements/{name}": {
        "get": _op("show an entitlement with its machines and jobs", "the entitlement", "Entitlement"),
        "patch": _op("modify quota, profile, owner or spread", "the entitlement", "Entitlement", "EntitlementPatch"),
    },
    "/v1/entitlements/{name}/move": {"post": _op("give the entitlement to another scheduler shard (no task restarts)",
                                                  "the entitlement", "Entitlement", "EntitlementMove")},
    "/v1/entitlements/{name}/rollout": {"get": _op("the entitlement's host-profile rollout: each machine's phase, the "
                                                   "batches, why it paused", "the rollout", "Rollout")},
    "/v1/entitlements/{name}/rollout/pause": {"post": _op("pause the rollout (admin): the batch in progress ends, no "
                                                          "other begins", "the rollout", "Rollout")},
    "/v1/entitlements/{name}/rollout/resume": {"post": _op("resume a paused rollout (admin): its failed machines switch "
                                                           "again first", "the rollout", "Rollout")},
    "/v1/entitlements/{name}/rollout/rollback": {"post": _op("roll back (admin): the machines that changed go back to "
                                                             "the old profile in batches; the others never change",
                                                             "the rollout", "Rollout")},
    "/v1/jobs": {
        "post": _op("create a job: validated, placed and committed in one transaction", "created", "Job", "JobSpec", "201"),
        "get": _op("list jobs (?entitlement=NAME)", "the jobs", "JobList"),
    },
    "/v1/jobs/{ent}/{name}": {
        "get": _op("show a job with its tasks and machines", "the job", "Job"),
        "put": _op("update a job; a changed task starts a rolling update", "the job", "Job", "JobSpec"),
        "delete": _op("stop a job", "stopping", "Job", status="202"),
    },
    "/v1/jobs/{ent}/{name}/resize": {"post": _op("change a job's task count", "the job", "Job", "Resize")},
    "/v1/jobs/{ent}/{name}/dry-run": {"post": _op("what an update (PUT's body) would do, asked of the job's "
                                                  "TaskController in calls marked dryRun: the rounds, which tasks in "
                                                  "what order; changes nothing", "the rounds", "DryRun", "JobSpec")},
    "/v1/jobs/{ent}/{name}/usage": {"get": _op("a job's usage now and over time, against what it reserved "
                                               "(?tasks=1: and each task's)", "the usage", "UsageHistory")},
    "/v1/jobs/{ent}/{name}/autoscale": {"get": _op("what the SRM does with a job: its recommendation and why, "
                                                   "its last resizes, its size over time", "the status",
                                                   "AutoscaleStatus")},
    "/v1/entitlements/{name}/usage": {"get": _op("an entitlement's usage now and over time, against what its jobs "
                                                 "reserved", "the usage", "UsageHistory")},
    "/v1/rebalance/plan": {"get": _op("what the ReBalancer would do (a dry run): each goal's score before and after, "
                                      "the moves and why", "the plan", "RebalancePlan")},
    "/v1/rebalance/apply": {"post": _op("one round of the ReBalancer (admin): the plan, and its moves requested of the "
                                        "jobs' shard leaders, which carry them out make-before-break through the "
                                        "jobs' TaskControllers", "the round", "RebalanceRound")},
    "/v1/rebalance": {"get": _op("what the ReBalancer is doing: its continuous mode, the tasks moving, the last "
                                 "moves' outcomes", "the status", "RebalanceStatus")},
    "/v1/rebalance/enable": {"post": _op("turn the continuous mode on (admin), for an entitlement or all",
                                         "the status", "RebalanceStatus", "RebalanceSwitch")},
    "/v1/rebalance/disable": {"post": _op("turn the continuous mode off (admin), for an entitlement or all",
                                          "the status", "RebalanceStatus", "RebalanceSwitch")},
    "/v1/capacity": {"get": _op("opportunistic capacity: the reclaims open (machines taken back for guaranteed "
                                "entitlements, with notice) and the last ones over; whether reclaims are paused",
                                "the status", "Capacity")},
    "/v1/capacity/pause": {"post": _op("no reclaim begins from now on (admin); those begun go on", "the status",
                                       "Capacity")},
    "/v1/capacity/resume": {"post": _op("reclaims begin again (admin)", "the status", "Capacity")},
    "/v1/capacity/reserve": {"post": _op("the free machines per machine type and dc that opportunistic entitlements "
                                         "leave free, refilled by reclaims with notice (admin; 0: none)", "the status",
                                         "Capacity", "CapacityReserve")},
    "/v1/capacity/forecast": {"get": _op("the machines opportunistic work can count on for the next 24 hours, per "
                                         "machine type and dc: expected, and with 99 % (the SLO offered) and 99.9 % "
                                         "probability, from the pool's history", "the forecast", "CapacityForecast")},
    "/v1/capacity/slo": {"get": _op("how well the region kept the capacity it offered: hours judged and delivered, "
                                    "and the reclaims by cause with the notice they gave", "the SLO", "CapacitySlo")},
    "/v1/capacity/history": {"get": _op("the pool's hours kept, per machine type and dc: machines, guaranteed, "
                                        "opportunistic, free, reclaiming, available (the hour's least), buffer, and "
                                        "the line offered for the hour", "the history", "CapacityHistory")},
    "/v1/fleet": {"get": _op("the region's machines summed per dc, msb, entitlement, profile and machine type: held, "
                             "healthy, in maintenance, reserved, used; the free pool; what each entitlement can still "
                             "fit", "the fleet", "Fleet")},
    "/v1/machines": {"get": _op("list machines", "the machines", "MachineList")},
    "/v1/machines/{id}": {"get": _op("show a machine with its tasks", "the machine", "Machine")},
    "/v1/machines/{id}/release": {"post": _op("end the machine's credential: a bootstrap token may register it again",
                                              "the machine", "Machine")},
    "/v1/machines/{id}/clean": {"post": _op("drop the machine's tombstones (admin): none of the tasks moved off it "
                                            "runs there any more (it was wiped, or is gone for good)",
                                            "the machine", "Machine")},
    "/v1/events": {"get": _op("unavailability events", "the events", "EventList")},
    "/v1/tokens": {
        "post": _op("make an API token (admin): its secret is in this answer only", "the token", "Token", "TokenSpec",
                    "201"),
        "get": _op("the API tokens, never their secrets (admin)", "the tokens", "TokenList"),
    },
    "/v1/tokens/{id}": {"delete": _op("revoke an API token (admin)", "revoked", "Revoked")},
    "/v1/maintenance": {
        "post": _op("schedule maintenance on machines (listed, or by dc/msb/rack)", "scheduled", "Maintenance",
                    "MaintenanceSpec", "201"),
        "get": _op("maintenance not over yet (?all=1: all)", "the maintenance", "MaintenanceList"),
    },
    "/v1/dry-run/maintenance": {"post": _op("what each job with tasks on the machines would do before the deadline, "
                                            "asked of its TaskController in calls marked dryRun; schedules nothing",
                                            "the jobs' rounds", "MaintenanceDryRun", "MaintenanceSpec")},
    "/v1/maintenance/{id}": {"get": _op("a maintenance with the tasks on its machines", "the maintenance", "Maintenance")},
    "/v1/maintenance/{id}/end": {"post": _op("end a maintenance now (before its deadline: cancel it)", "the maintenance",
                                             "Maintenance")},
    "/v1/discovery/{ent}/{name}": {"get": _op("a job's service discovery records", "the endpoints", "Discovery")},
    "/v1/agent/register": {"post": _op("register a machine (bootstrap token); returns its credential",
                                       "registered", "Registration", "AgentRegister", security="bootstrapToken")},
    "/v1/agent/desired": {"get": _op("long-poll the machine's desired state (?version=V&wait=S)", "the desired state",
                                     "DesiredState", security="machineCredential")},
    "/v1/agent/heartbeat": {"post": _op("heartbeat with the machine's task report", "accepted", "HeartbeatReply",
                                        "Heartbeat", security="machineCredential")},
    "/v1/agent/shutdown": {"post": _op("announce a clean reboot: the machine is in maintenance until it heartbeats "
                                       "again (at most --reboot-grace seconds)", "announced", "ShutdownReply",
                                       "Shutdown", security="machineCredential")},
    "/v1/cluster": {"get": _op("the region's replicas, shard leaders and each shard's entitlements", "the cluster",
                               "Cluster")},
    "/v1/internal/relay": {"post": _op("heartbeats and task reports relayed between replicas", "accepted", "Relayed",
                                       "Relay")},
    "/v1/internal/usage/tasks": {"get": _op("each task's usage as this replica's heartbeats carried it (the "
                                            "replicas ask each other for it)", "the tasks' figures",
                                            "TaskFigures")},
    "/v1/openapi.json": {"get": {"summary": "this document", "security": [], "responses": {"200": {"description": "OpenAPI"}}}},
    "/healthz": {"get": {"summary": "200 when etcd answers now (asked on each call), else 503 saying why (no token)", "security": [],
                         "responses": {"200": {"description": "serving", **_json(_ref("Health"))},
                                       "503": {"description": "etcd unreachable", **_json(_ref("Health"))}}}},
    "/v1/metrics": {"get": {"summary": "Prometheus metrics (text)", "security": [{"apiToken": []}],
                            "responses": {"200": {"description": "the metrics",
                                                  "content": {"text/plain": {"schema": {"type": "string"}}}},
                                          "401": ERRORS["401"]}}},
}

NAME_PARAM = {"type": "string", "pattern": NAME.pattern}
ID_PARAM = {"type": "string", "minLength": 1, "maxLength": 253}
MAX_MOVES_PARAM = ("max_moves", {"type": "integer", "minimum": 0, "maximum": schemas_of.MAX_ROUND_MOVES},
                   "the round's move budget: hotspots first, then the machines cheapest to free, then repair; no swap")
PATH_PARAMS = {"name": NAME_PARAM, "ent": NAME_PARAM, "id": ID_PARAM}
HISTORY_PARAMS = [("since", {"type": "integer", "minimum": 60, "maximum": usage.MAX_SINCE},
                   "how far back, in seconds (8 weeks at most; an hour by default)"),
                  ("step", {"type": "integer", "minimum": 60, "maximum": usage.MAX_STEP, "multipleOf": 60},
                   "seconds a point covers: whole minutes; whole hours when since is beyond 48 h (else 422); at "
                   "most 10,000 points (else 422)")]
QUERY_PARAMS = {
    ("/v1/jobs", "get"): [("entitlement", NAME_PARAM, "only the jobs of this entitlement")],
    ("/v1/jobs/{ent}/{name}/usage", "get"): [*HISTORY_PARAMS, ("tasks", {"type": "string",
                                                                          "enum": list(schemas_of.ALL)},
                                                               "1: also each task's usage (tasks)")],
    ("/v1/internal/usage/tasks", "get"): [
        ("job", {"type": "array", "maxItems": peers.MAX_NAMES,
                 "items": {"type": "string", "pattern": usage.HANDLE.pattern}}, "the tasks of these jobs"),
        ("entitlement", {"type": "array", "maxItems": peers.MAX_NAMES, "items": NAME_PARAM},
         "and of these entitlements' jobs (neither: every job's)")],
    ("/v1/entitlements/{name}/usage", "get"): HISTORY_PARAMS,
    ("/v1/machines", "get"): [("dc", {"type": "string", "minLength": 1, "maxLength": 253}, "only this dc's machines"),
                              ("msb", {"type": "string", "minLength": 1, "maxLength": 253}, "only this MSB's machines")],
    ("/v1/capacity/forecast", "get"): [("entitlement", NAME_PARAM, "only the machines this entitlement can use")],
    ("/v1/capacity/slo", "get"): [("entitlement", NAME_PARAM, "only the machines this entitlement can use")],
    ("/v1/capacity/history", "get"): [
        ("entitlement", NAME_PARAM, "only the machines this entitlement can use"),
        ("since", {"type": "integer", "minimum": 3600, "maximum": slo.HOURS_KEPT * 3600},
         "how far back, in seconds (a week by default; 8 weeks are kept)")],
    ("/v1/rebalance/plan", "get"): [("entitlement", NAME_PARAM, "only this entitlement's machines"), MAX_MOVES_PARAM],
    ("/v1/rebalance/apply", "post"): [("entitlement", NAME_PARAM, "only this entitlement's machines"), MAX_MOVES_PARAM],
    ("/v1/fleet", "get"): [("by", {"type": "string", "pattern": usage.BY.pattern}, "the dimensions to sum by, "
                            "comma-separated: dc, msb, entitlement, profile, type (all by default)")],
    ("/v1/maintenance", "get"): [("all", {"type": "string", "enum": list(schemas_of.ALL)},
                                  "1: also the maintenance that is over")],
    ("/v1/agent/desired", "get"): [("version", {"type": "string", "maxLength": schemas_of.MAX_VERSION},
                                    "the version the agent has"),
                                   ("wait", {"type": "number", "minimum": 0, "maximum": schemas_of.MAX_WAIT_ASKED},
                                    "seconds to wait for a change (at most --max-long-poll are waited: 60 by default)")],
}


def _parameters() -> None:
    """Every path parameter and query parameter, declared (schema-driven tools refuse undeclared ones)."""
    for path, ops in PATHS.items():
        for method, op in ops.items():
            params = [{"name": n, "in": "path", "required": True, "schema": PATH_PARAMS[n]}
                      for n in re.findall(r"{(\w+)}", path)]
            params += [{"name": n, "in": "query", "required": False, "schema": sch, "description": what}
                       for n, sch, what in QUERY_PARAMS.get((path, method), [])]
            if params:
                op["parameters"] = params


_parameters()

@cache
def document(region: str | None = None) -> dict:
    """The document; served by a daemon, it names the region it serves (the only labels.region
    its registrations take)."""
    schemas = dict(schemas_of.components())
    if region is not None:
        labels = schemas["MachineLabels"]
        schemas["MachineLabels"] = {**labels, "properties": {
            **labels["properties"], "region": {"type": "string", "enum": [region],
                                               "description": "the region this control plane serves"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "twine-controld", "version": "v1",
                 "description": "The regional control plane of a Twine-style cluster manager (docs/api.md)."},
        "paths": PATHS,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "apiToken": {"type": "http", "scheme": "bearer", "description": "operator / job owner token"},
                "bootstrapToken": {"type": "http", "scheme": "bearer", "description": "agent bootstrap token"},
                "machineCredential": {"type": "http", "scheme": "bearer", "description": "per-machine credential"},
            },
        },
    }
