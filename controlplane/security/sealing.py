"""Secret task environment values sealed at rest (issue #11: "readable only by the agent that runs
the task"), as Kubernetes' EncryptionConfiguration seals Secrets with a key file.

controld's `--secret-key-file` holds one key a line, `NAME:BASE64` (32 bytes: AES-256), readable
by its owner only. The first key seals; every key listed opens (rotation: list the new key second
on every replica, restart, then first; values move to it as their jobs' specs change, and the
old key may go once none is left: Sealer.unknown_keys, said at start). A value in etcd is
`twine-sealed:v1:NAME:BASE64(nonce + AES-GCM ciphertext)`, bound to its job and variable name
(the associated data): one copied onto another job or name does not open.

A job's `controller_token` (sent to its TaskController) is sealed the same way, bound to the job
and to the name "#controller_token" (never a variable's), and opened only where the shard's leader
calls the controller.

Values are sealed when the API takes a job (create, update, run again) and opened only where the
agent's desired state is made (RegionState.desired_for; a value that does not open there makes
the agent's answer a 503, so its tasks keep running). An update that sends the same value as the
job holds keeps the sealed value as it is, so the job's spec does not change and its tasks do
not restart (AES-GCM seals the same value differently each time, and a new key would too).
Without a key file, values are kept as given (as before this module): the daemon warns at start.
A value written before the key file was given stays readable, and as it is (in clear) until an
update changes it: sealing it on an identical update would change the spec and restart the tasks.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
from typing import Any

from controlplane.security.secretfile import read_secret

log = logging.getLogger("twine.controld.sealing")
PREFIX = "twine-sealed:v1:"
TOKEN = "#controller_token"  # the name a job's controller_token is sealed under (no variable has it)
KEY_NAME = re.compile(r"[A-Za-z0-9_.-]{1,32}")


def field_of(var: str) -> str:
    """The field of a job a sealed value is: its controller_token, or one of its secret values."""
    return "controller_token" if var == TOKEN else f"task.secret_env.{var}"


def _not_sealed(var: str, value: str) -> None:
    """A value sent in the form of a sealed one would be taken for one: refused (ValueError
    "field: why", the API's 422)."""
    if value.startswith(PREFIX):
        raise ValueError(f"{field_of(var)}: may not begin with {PREFIX!r} (the form of a sealed value)")


class SealingError(Exception):
    """A sealed value this daemon cannot open (its key is not in --secret-key-file, or it was
    altered)."""


class Sealer:
    def __init__(self, keys: list[tuple[str, bytes]] | None = None):
        self.keys = list(keys or [])
        self._by_name = dict(self.keys)

    @classmethod
    def load(cls, path: str) -> "Sealer":
        """The keys of a key file. ValueError names what is wrong (the daemon exits 2)."""
        text = read_secret(path, "keys")
        keys: list[tuple[str, bytes]] = []
        for n, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, b64 = line.partition(":")
            if not sep or not KEY_NAME.fullmatch(name):
                raise ValueError(f"{path}:{n}: a key is NAME:BASE64, NAME of 1-32 letters, digits or '_.-'")
            try:
                key = base64.b64decode(b64.strip(), validate=True)
            except binascii.Error:
                raise ValueError(f"{path}:{n}: key {name}: not base64") from None
            if len(key) != 32:
                raise ValueError(f"{path}:{n}: key {name}: {len(key)} bytes; an AES-256 key is 32 "
                                 "(head -c 32 /dev/urandom | base64)")
            if any(name == k for k, _ in keys):
                raise ValueError(f"{path}:{n}: key {name} is listed twice")
            keys.append((name, key))
        if not keys:
            raise ValueError(f"{path}: no key in it")
        return cls(keys)

    @staticmethod
    def new_key_line(name: str = "key1") -> str:
        return f"{name}:{base64.b64encode(os.urandom(32)).decode()}"

    @staticmethod
    def _aad(handle: str, var: str) -> bytes:
        return f"{handle}\0{var}".encode()

    def seal(self, handle: str, var: str, value: str) -> str:
        if not self.keys:
            return value
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        name, key = self.keys[0]
        nonce = os.urandom(12)
        sealed = nonce + AESGCM(key).encrypt(nonce, str(value).encode(), self._aad(handle, var))
        return f"{PREFIX}{name}:{base64.b64encode(sealed).decode()}"

    def open(self, handle: str, var: str, value: Any) -> Any:
        """A value as the agent receives it. One not sealed (written without a key) is itself."""
        if not isinstance(value, str) or not value.startswith(PREFIX):
            return value
        name, _, b64 = value[len(PREFIX):].partition(":")
        key = self._by_name.get(name)
        what = field_of(var)
        if key is None:
            raise SealingError(f"{handle}: {what} is sealed with key {name!r}, which is not in --secret-key-file")
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        try:
            raw = base64.b64decode(b64, validate=True)
            return AESGCM(key).decrypt(raw[:12], raw[12:], self._aad(handle, var)).decode()
        except (binascii.Error, ValueError, InvalidTag):
            raise SealingError(f"{handle}: {what} does not open with key {name!r} (altered, or moved from another "
                               "job or variable)") from None

    def key_of(self, value: Any) -> str | None:
        """The name of the key a stored value is sealed with (None: not sealed)."""
        if not isinstance(value, str) or not value.startswith(PREFIX):
            return None
        return value[len(PREFIX):].partition(":")[0]

    def unknown_keys(self, templates, tokens=()) -> dict[str, int]:
        """Values sealed with keys this daemon does not have, by key: counted at start, over the
        jobs' templates' secret values and their controller tokens."""
        out: dict[str, int] = {}
        values = [v for task in templates for v in (task.get("secret_env") or {}).values()]
        for value in [*values, *tokens]:
            name = self.key_of(value)
            if name is not None and name not in self._by_name:
                out[name] = out.get(name, 0) + 1
        return out

    def seal_token(self, handle: str, token: str | None, held: str | None) -> str | None:
        """A job's controller_token as the store keeps it: the token it holds (`held`, sealed)
        when that opens to the same token with the first key; else sealed anew."""
        if token is None:
            return None
        _not_sealed(TOKEN, token)
        if not self.keys:
            return token
        return self._kept_or_sealed(handle, TOKEN, token, held, any_key=False)

    def seal_task(self, handle: str, task: dict, old: dict | None = None) -> dict:
        """The template with its secret values sealed; a value the job holds already (`old`, its
        current template) keeps its sealed form, so an unchanged job stays unchanged. When the
        template changes anyway (a new spec version), values sealed with a key other than the
        first are sealed again with the first: so a rotation ends once each job has changed."""
        secret = task.get("secret_env") or {}
        for var, value in secret.items():
            if isinstance(value, str):
                _not_sealed(var, value)
        if not secret or not self.keys:
            return task
        old = old or {}
        held = old.get("secret_env") or {}
        rest_same = {k: v for k, v in task.items() if k != "secret_env"} == \
            {k: v for k, v in old.items() if k != "secret_env"} and set(secret) == set(held)
        return {**task, "secret_env": {var: self._kept_or_sealed(handle, var, value, held.get(var), any_key=rest_same)
                                       for var, value in secret.items()}}

    def _kept_or_sealed(self, handle: str, var: str, value: str, was: str | None, any_key: bool) -> str:
        """`was` (the sealed form held) when it opens to `value` and is sealed with the first key
        (with any key: `any_key`); else `value` sealed anew with the first key."""
        try:
            same = was is not None and self.open(handle, var, was) == value
        except SealingError:
            same = False
        return was if same and (any_key or self.key_of(was) == self.keys[0][0]) else self.seal(handle, var, value)

    def open_task(self, handle: str, task: dict) -> dict:
        """The template with its secret values opened (SealingError when one cannot be)."""
        secret = task.get("secret_env")
        if not secret:
            return task
        return {**task, "secret_env": {var: self.open(handle, var, v) for var, v in secret.items()}}
