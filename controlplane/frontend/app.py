"""The front end (paper 2.1): a versioned REST API (/v1) over aiohttp (docs/api.md; the OpenAPI
document is served at /v1/openapi.json). Every request but that one and /healthz is authenticated
with a Bearer token.

The handlers are grouped by what they serve, each group given the services it uses (services.py):
entitlements.py, jobs.py (and discovery), machines.py (and events), tokens.py, maintenance.py (the
ops planner's), agents.py (the resource broker's), meta.py (the document, health, metrics, the
cluster, the replicas' relay). middleware.py runs around each: authentication, roles, errors.
Handlers validate first and write last: a refused request (4xx) has written nothing to etcd.
"""

from __future__ import annotations

from aiohttp import web

from controlplane.frontend.agents import Agents
from controlplane.frontend.auth import Authenticator
from controlplane.frontend.body import BODY_TIMEOUT, MAX_INTERNAL_BODY
from controlplane.frontend.entitlements import Entitlements
from controlplane.frontend.jobs import Jobs
from controlplane.frontend.machines import Machines
from controlplane.frontend.maintenance import Maintenance
from controlplane.frontend.meta import Meta
from controlplane.frontend.middleware import Gate
from controlplane.frontend.services import Services
from controlplane.frontend.tokens import Tokens
from controlplane.frontend.usage import Usage
from controlplane.frontend.autoscale import AutoscaleView
from controlplane.frontend.dryruns import DryRuns
from controlplane.frontend.capacity import CapacityView
from controlplane.frontend.rebalance import Rebalance
from controlplane.frontend.rollouts import Rollouts
from controlplane.frontend import ui

ROUTES = [
    ("POST", "/v1/entitlements", Entitlements.create),
    ("GET", "/v1/entitlements", Entitlements.list),
    ("GET", "/v1/entitlements/{name}", Entitlements.show),
    ("PATCH", "/v1/entitlements/{name}", Entitlements.modify),
    ("POST", "/v1/entitlements/{name}/move", Entitlements.move),
    ("GET", "/v1/entitlements/{name}/usage", Usage.entitlement),
    ("GET", "/v1/entitlements/{name}/rollout", Rollouts.show),
    ("POST", "/v1/entitlements/{name}/rollout/pause", Rollouts.pause),
    ("POST", "/v1/entitlements/{name}/rollout/resume", Rollouts.resume),
    ("POST", "/v1/entitlements/{name}/rollout/rollback", Rollouts.rollback),
    ("POST", "/v1/jobs", Jobs.create),
    ("GET", "/v1/jobs", Jobs.list),
    ("GET", "/v1/jobs/{ent}/{name}", Jobs.show),
    ("PUT", "/v1/jobs/{ent}/{name}", Jobs.update),
    ("POST", "/v1/jobs/{ent}/{name}/resize", Jobs.resize),
    ("POST", "/v1/jobs/{ent}/{name}/dry-run", Jobs.dry_run),
    ("DELETE", "/v1/jobs/{ent}/{name}", Jobs.stop),
    ("GET", "/v1/jobs/{ent}/{name}/usage", Usage.job),
    ("GET", "/v1/jobs/{ent}/{name}/autoscale", AutoscaleView.show),
    ("GET", "/v1/fleet", Usage.fleet),
    ("GET", "/v1/rebalance/plan", Rebalance.plan),
    ("POST", "/v1/rebalance/apply", Rebalance.apply),
    ("GET", "/v1/rebalance", Rebalance.status),
    ("POST", "/v1/rebalance/enable", Rebalance.enable),
    ("POST", "/v1/rebalance/disable", Rebalance.disable),
    ("GET", "/v1/capacity", CapacityView.status),
    ("POST", "/v1/capacity/pause", CapacityView.pause),
    ("POST", "/v1/capacity/resume", CapacityView.resume),
    ("POST", "/v1/capacity/reserve", CapacityView.reserve),
    ("GET", "/v1/capacity/forecast", CapacityView.forecast),
    ("GET", "/v1/capacity/slo", CapacityView.service_level),
    ("GET", "/v1/capacity/history", CapacityView.past),
    ("GET", "/v1/machines", Machines.list),
    ("GET", "/v1/machines/{id}", Machines.show),
    ("POST", "/v1/machines/{id}/release", Machines.release),
    ("POST", "/v1/machines/{id}/clean", Machines.clean),
    ("POST", "/v1/tokens", Tokens.create),
    ("GET", "/v1/tokens", Tokens.list),
    ("DELETE", "/v1/tokens/{id}", Tokens.revoke),
    ("GET", "/v1/events", Machines.events),
    ("POST", "/v1/maintenance", Maintenance.schedule),
    ("POST", "/v1/dry-run/maintenance", DryRuns.maintenance),
    ("GET", "/v1/maintenance", Maintenance.list),
    ("GET", "/v1/maintenance/{id}", Maintenance.show),
    ("POST", "/v1/maintenance/{id}/end", Maintenance.end),
    ("GET", "/v1/discovery/{ent}/{name}", Jobs.discovery),
    ("POST", "/v1/agent/register", Agents.register),
    ("GET", "/v1/agent/desired", Agents.desired),
    ("POST", "/v1/agent/heartbeat", Agents.heartbeat),
    ("POST", "/v1/agent/shutdown", Agents.shutdown),
    ("GET", "/v1/openapi.json", Meta.openapi),
    ("GET", "/v1/metrics", Meta.metrics),
    ("GET", "/v1/cluster", Meta.cluster),
    ("POST", "/v1/internal/relay", Meta.relay_in),
    ("GET", "/v1/internal/usage/tasks", Usage.tasks_here),
    ("GET", "/healthz", Meta.healthz),
]


def make_app(s: Services) -> web.Application:
    groups = [
        Entitlements(s.state, s.settings.profile_search),
        Jobs(s.state, s.shards, s.forwarder, s.reach, s.prometheus_url),
        AutoscaleView(s.state, s.srm, s.shards, s.forwarder),
        Rebalance(s.state, s.usage, s.shards),
        Rollouts(s.state),
        CapacityView(s.state, s.capacity),
        DryRuns(s.state, s.shards, s.forwarder),
        Machines(s.state, s.agents, s.clean),
        Tokens(s.state),
        Maintenance(s.ops),
        Agents(s.agents),
        Meta(s.state, s.shards, s.coordinator, s.relay, s.metrics),
        Usage(s.state, s.usage, s.recorder, s.shards, s.forwarder),
    ]
    by_class = {type(g): g for g in groups}
    gate = Gate(s.state, Authenticator(s.state, s.agents, s.settings.api_tokens), s.settings.roles)
    app = web.Application(middlewares=[gate.middleware], client_max_size=MAX_INTERNAL_BODY)
    app[BODY_TIMEOUT] = s.settings.body_timeout
    for method, path, handler in ROUTES:
        group = by_class[next(c for c in by_class if handler.__qualname__.startswith(c.__qualname__ + "."))]
        app.router.add_route(method, path, handler.__get__(group))
    ui.add_routes(app)  # the fleet page (not the API: static files, in no OpenAPI document)
    return app
