"""TLS contexts for the region's HTTP: twine-controld serves its API over TLS when given a certificate
and key; agents, twinectl and the replicas themselves verify it against a CA file (the region's
own CA, as a Kubernetes cluster's) or the system's CAs. Files that cannot be read or do not hold
what they should are an InputError naming the file, never a traceback."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from agent.errors import InputError


def _load(where: str, field: str, path: str | Path, load):
    try:
        return load()
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
    """For a client: servers verified against `ca` (a PEM bundle) alone, or the system's CAs when
    None (as kubectl's certificate-authority: a region's CA is the only one its clients trust);
    host names checked. `cert` and `key`, when given, are this client's own certificate."""
    if ca is None:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        ctx = _load(where, field, ca, lambda: ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca)))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None or key is not None:
        if cert is None or key is None:
            raise InputError(where, field, f"{cert} / {key}", "a client certificate needs both its file and its key")
        _load(where, field, f"{cert} / {key}", lambda: ctx.load_cert_chain(str(cert), str(key)))
    return ctx


def default_trust(ca: str | Path | None) -> None:
    """This process's default trust (contexts made with no CA named): the region's CA file alone,
    when there is one; an SSL_CERT_FILE already set is kept. Called before aiohttp is imported: it
    makes a default context at import, used or not, and the system's CAs parsed for it took 2-5 s
    of an agent's start on an emulated guest (0.2-0.4 s on a host). The agent verifies its control
    plane against `ca` and calls no other HTTPS server."""
    if ca is not None:
        os.environ.setdefault("SSL_CERT_FILE", str(ca))
