"""/v1/tokens: API tokens an admin makes, lists and revokes (security/tokens.py: roles, scopes,
what etcd keeps of them: a hash, never the secret)."""

from __future__ import annotations

import time

from aiohttp import web

from controlplane.frontend import schema as S
from controlplane.frontend.body import body, reply
from controlplane.security import tokens
from controlplane.store import Versioned
from controlplane.store.records import ApiError
from controlplane.store.state import RegionState


class Tokens:
    def __init__(self, state: RegionState):
        self.state = state

    async def create(self, request: web.Request) -> web.Response:
        token_id, secret, record = tokens.parse_new(await body(request, schema=S.TokenSpec), time.time())
        key = self.state.keys.token(token_id)
        await self.state.write([Versioned(key, None, 0)], {key: record})
        return reply({**tokens.answer(record), "token": secret}, 201)

    async def list(self, request: web.Request) -> web.Response:
        return reply({"tokens": [tokens.answer(r) for _, r in sorted(self.state.tokens.items())]})

    async def revoke(self, request: web.Request) -> web.Response:
        token_id = request.match_info["id"]
        if token_id not in self.state.tokens:
            raise ApiError("not_found", "token", f"no token {token_id!r}")
        key = self.state.keys.token(token_id)
        await self.state.write([self.state.guard(key)], {}, [key])
        return reply({"revoked": token_id})
