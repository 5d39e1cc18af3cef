"""API tokens with roles (issue #11): who may do what through the API.

Roles:
  admin   everything (the tokens in --api-token-file are admin tokens: the region's first key);
  owner   reads everything; creates, updates, resizes and stops the jobs of the entitlements it
          owns (its `entitlements`), nothing else;
  reader  reads everything, changes nothing;
  bootstrap  registers new machines (POST /v1/agent/register) and nothing else; it always expires
          (24 h unless `expires_in` says otherwise), as Kubernetes' bootstrap tokens. The tokens
          of --bootstrap-token-file are bootstrap tokens that expire --bootstrap-token-ttl (a day)
          after the file was written (broker/agents.py BootstrapFile).

A token is `<id>.<secret>`, shown once when it is made. etcd keeps only its record under
/twine/<region>/tokens/<id>: the secret's sha256, the role, the entitlements, the expiry; so a
copy of etcd holds no usable token. Tokens are made, listed and revoked by admins
(`twinectl token create|list|revoke`). Every refusal is a 403 naming the permission missing, and
every request that changes something is written to the audit log (logger twine.audit): who, what,
and the answer's status.
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
import time
from dataclasses import dataclass

from controlplane.broker.agents import sha256
from controlplane.store.records import ApiError

audit = logging.getLogger("twine.audit")
ROLES = ("admin", "owner", "reader", "bootstrap")
BOOTSTRAP_TTL = 86400.0  # a bootstrap token's life when its maker does not say
TOKEN_ID = re.compile(r"^[a-f0-9]{12}$")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: `name` for the audit log and the refusals."""

    name: str
    role: str
    entitlements: frozenset[str] = frozenset()

    def may_change_jobs_of(self, entitlement: str) -> bool:
        return self.role == "admin" or (self.role == "owner" and entitlement in self.entitlements)

    def describe(self) -> str:
        owns = f" of {', '.join(sorted(self.entitlements))}" if self.role == "owner" else ""
        return f"{self.name} ({self.role}{owns})"


def resolve(token: str, file_tokens: set[str], records: dict[str, dict], now: float | None = None) -> Principal | None:
    """The principal a bearer token names, or None (unknown, revoked or expired)."""
    raw = token.encode(errors="surrogateescape")
    if any(hmac.compare_digest(raw, t.encode()) for t in file_tokens):
        return Principal("api-token-file", "admin")
    token_id, _, secret = token.partition(".")
    rec = records.get(token_id) if TOKEN_ID.fullmatch(token_id) else None
    if rec is None or not secret or not hmac.compare_digest(sha256(secret), str(rec.get("sha256", ""))):
        return None
    expires = rec.get("expires")
    if expires is not None and (now if now is not None else time.time()) >= expires:
        return None
    return Principal(f"token {token_id}", rec.get("role", "reader"), frozenset(rec.get("entitlements") or ()))


def parse_new(data: dict, now: float) -> tuple[str, str, dict]:
    """A POST /v1/tokens body (its shape checked: schema.TokenSpec) -> (id, the secret token, the
    record to store)."""
    role, ents = data["role"], data.get("entitlements") or []
    if role == "owner" and not ents:
        raise ApiError("unprocessable", "entitlements", "an owner token names the entitlements it owns")
    if role != "owner" and ents:
        raise ApiError("unprocessable", "entitlements", f"only an owner token names entitlements, not a{'n' if role == 'admin' else ''} {role} token")
    expires_in = data.get("expires_in")
    if role == "bootstrap" and expires_in is None:
        expires_in = BOOTSTRAP_TTL  # a machine's key to the region does not lie around for ever
    description = data.get("description", "")
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    record = {"id": token_id, "sha256": sha256(secret), "role": role, "entitlements": sorted(set(ents)),
              "created_at": now, "expires": None if expires_in is None else now + expires_in,
              "description": description}
    return token_id, f"{token_id}.{secret}", record


def answer(record: dict) -> dict:
    """A token's record as the API shows it: never the hash."""
    return {k: v for k, v in record.items() if k != "sha256"}


def authorize(p: Principal, method: str, path: str, job_entitlement: str | None) -> None:
    """Raise 403 unless `p` may make this request. `job_entitlement`: the entitlement of the job a
    /v1/jobs/{ent}/... path names (POST /v1/jobs is checked by its handler, which reads the body)."""
    if p.role == "admin":
        return
    if p.role == "bootstrap":
        raise forbidden(p, method, path, "a reader, owner or admin token (a bootstrap token only registers machines)")
    if path.startswith("/v1/tokens"):  # even their list: who holds what is the admins'
        raise forbidden(p, method, path, "admin")
    if method in ("GET", "HEAD", "OPTIONS"):
        return
    if p.role == "owner" and path.startswith("/v1/jobs"):
        if job_entitlement is None or p.may_change_jobs_of(job_entitlement):
            return
        raise forbidden(p, method, path, f"owner of entitlement {job_entitlement}")
    # a reader's change of a job would need an owner's token (or an admin's); anything else, an admin's
    raise forbidden(p, method, path, "owner or admin" if path.startswith("/v1/jobs") else "admin")


def forbidden(p: Principal, method: str, path: str, needs: str) -> ApiError:
    return ApiError("forbidden", None, f"{p.describe()} may not {method} {path}: that needs {needs}")
