"""TLS contexts for the region's HTTP: twine-controld serves its API over TLS when given a certificate
and key; agents, twinectl and the replicas themselves verify it against a CA file (the region's
own CA, as a Kubernetes cluster's) or the system's CAs. Files that cannot be read or do not hold
what they should are an InputError naming the file, never a traceback."""

from __future__ import annotations

import ssl
from pathlib import Path

from agent.errors import InputError


def _load(where: str, field: str, path: str | Path, load) -> None:
    try:
        load()
    except FileNotFoundError:
        raise InputError(where, field, str(path), "no such file") from None
    except PermissionError:
        raise InputError(where, field, str(path), "permission denied") from None
    except IsADirectoryError:
        raise InputError(where, field, str(path), "a directory, not a file") from None
    except (ssl.SSLError, OSError, ValueError) as e:
        raise InputError(where, field, str(path), f"not a usable PEM file: {e}") from None


def server_context(cert: str | Path, key: str | Path, where: str = "command line") -> ssl.SSLContext:
    """For a server: its certificate chain and private key (PEM). TLS 1.2 at least."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(where, "--tls-cert/--tls-key", f"{cert} / {key}", lambda: ctx.load_cert_chain(str(cert), str(key)))
    return ctx


def client_context(ca: str | Path | None, where: str = "command line", field: str = "--tls-ca",
                   cert: str | Path | None = None, key: str | Path | None = None) -> ssl.SSLContext:
    """For a client: servers verified against `ca` (a PEM bundle), or the system's CAs when None;
    host names checked. `cert` and `key`, when given, are this client's own certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None:
        _load(where, field, ca, lambda: ctx.load_verify_locations(cafile=str(ca)))
    if cert is not None or key is not None:
        if cert is None or key is None:
            raise InputError(where, field, f"{cert} / {key}", "a client certificate needs both its file and its key")
        _load(where, field, f"{cert} / {key}", lambda: ctx.load_cert_chain(str(cert), str(key)))
    return ctx
