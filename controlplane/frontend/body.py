"""What a request carries in and what an answer carries out: JSON bodies read strictly and within
bounds, answers encoded by msgspec."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from aiohttp import web

from controlplane.allocator import AllocationError, InvalidRequest, QuotaExceeded
from controlplane.frontend import schema as S
from controlplane.store.records import NAME, ApiError

MAX_BODY = 1024 * 1024  # bytes of a request body; the records it makes are capped below etcd's limits
MAX_INTERNAL_BODY = 16 * 1024 * 1024  # a replica's relay (every task report, for a member that joins)
BODY_TIMEOUT = web.AppKey("body_timeout", float)  # seconds a request has to send its body (--body-timeout)
_encode = msgspec.json.Encoder(enc_hook=str).encode  # what JSON has no form for, as its text


def query_flag(request: web.Request, field: str) -> bool:
    """A yes/no query parameter (`?all=1`, `?tasks=true`): 0, 1, true or false; absent is no."""
    text = request.query.get(field, "0")
    if text not in S.ALL:
        raise ApiError("invalid", field, f"{text[:80]!r}: 1 (or true) for yes, 0 (or false) for no")
    return text in ("1", "true")


def query_entitlement(request: web.Request, entitlements) -> str | None:
    """`?entitlement=E`: a name the region has (422 not a name, 404 no such), or None when absent."""
    ent = request.query.get("entitlement")
    if ent is not None and not NAME.fullmatch(ent):
        raise ApiError("invalid", "entitlement", f"{ent[:80]!r} is not an entitlement name")
    if ent is not None and ent not in entitlements:
        raise ApiError("not_found", "entitlement", f"no entitlement {ent!r}")
    return ent


def reply(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encode(data), status=status, content_type="application/json")


def allocation_error(e: AllocationError) -> ApiError:
    if isinstance(e, QuotaExceeded):
        return ApiError("quota", e.field, e.message)
    if isinstance(e, InvalidRequest):  # valid in itself, not for this entitlement as it is
        return ApiError("unprocessable", e.field, e.message)
    return ApiError("no_placement", e.field, e.message)


def _too_large(limit: int) -> ApiError:
    # made when it is raised, not on each request: a heartbeat's body() made one and let it go
    return ApiError("too_large", "body", f"more than the {limit} bytes accepted")


async def body(request: web.Request, limit: int = MAX_BODY, schema: type | None = None, typed: bool = False) -> Any:
    """The request's JSON body, strictly: standard JSON only (no NaN or Infinity), integers that
    fit 64 bits, nesting the decoder can follow, at most `limit` bytes, and within `schema` (the
    document's, controlplane/frontend/schema.py). Anything else is a 4xx naming the field, never a 500.
    `typed`: the body decoded straight into `schema`'s type, checked in the same pass (what a
    replica relays several times a second)."""
    if (request.content_length or 0) > limit:
        raise _too_large(limit)  # refused unread
    timeout = request.app[BODY_TIMEOUT]
    try:
        if request.content.is_eof():  # all here already (a heartbeat's, as a rule): nothing to wait for
            raw = await request.read()
        else:
            async with asyncio.timeout(timeout):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge:  # a stream without a length, past client_max_size
        raise _too_large(limit) from None
    except TimeoutError:  # a client trickling its body holds no connection for long
        raise ApiError("timeout", "body", f"not received within {timeout:g} s") from None
    if len(raw) > limit:
        raise _too_large(limit)
    if typed:
        return S.decoded(raw, schema)
    try:
        data = msgspec.json.decode(raw)
    except UnicodeDecodeError as e:  # JSON is UTF-8, whatever charset the request claims
        raise ApiError("invalid", "body", f"the body is not UTF-8 (JSON is): {e.reason} at byte {e.start}") from None
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        why = "nested too deep" if isinstance(e, RecursionError) else str(e)
        raise ApiError("invalid", "body", f"the body is not JSON within limits: {why}") from None
    return data if schema is None else S.checked(data, schema)
