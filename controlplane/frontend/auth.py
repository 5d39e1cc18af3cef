"""Who a request comes from (docs/api.md, "Authentication"): users by their API token and its
roles (security/tokens.py), agents by their machine's credential, a registering agent by a
bootstrap token. Each request is authorized here before its handler runs."""

from __future__ import annotations

from aiohttp import web

from controlplane.broker.agents import AgentService
from controlplane.security import tokens
from controlplane.store.records import ApiError
from controlplane.store.state import RegionState

MACHINE = "machine_id"  # request key: the machine an agent's request comes from
PRINCIPAL = "principal"  # request key: who an API request comes from (controlplane/security/tokens.py)


class Authenticator:
    def __init__(self, state: RegionState, agents: AgentService, api_tokens: set[str]):
        self.state = state  # its token records (those an admin made)
        self.agents = agents  # machine credentials and bootstrap tokens
        self.api_tokens = api_tokens  # --api-token-file's: admin tokens

    def authenticate(self, request: web.Request) -> None:
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme != "Bearer" or not token:
            raise ApiError("unauthorized", None, "missing 'Authorization: Bearer <token>'")
        path = request.path
        if path == "/v1/agent/register":  # a file's bootstrap token, or an unexpired one made by an admin
            who = tokens.Principal("bootstrap-token-file", "bootstrap") if self.agents.is_bootstrap(token) \
                else tokens.resolve(token, set(), self.state.tokens)
            ok = who is not None and who.role == "bootstrap"
            if ok:
                request[PRINCIPAL] = who  # audited by the token that registered (an admin-made one by its name)
        elif path.startswith("/v1/agent/"):
            mid = self.agents.machine_of(token)
            ok = mid is not None
            request[MACHINE] = mid
        else:
            principal = tokens.resolve(token, self.api_tokens, self.state.tokens)
            if principal is not None:
                request[PRINCIPAL] = principal
                tokens.authorize(principal, request.method, path, request.match_info.get("ent"))
            ok = principal is not None
        if not ok:
            raise ApiError("unauthorized", None, "the token is not valid for this request (unknown, revoked or expired)")
