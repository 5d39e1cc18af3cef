"""twinectl's side of the daemon's REST API: one aiohttp session, the daemon's answers made into
results or into errors with twinectl's exit codes (the module docstring of twinectl.py lists them)."""

from __future__ import annotations

import json
import ssl
from typing import Any, Self
from urllib.parse import quote

import aiohttp

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_UNREACHABLE, EXIT_UNAUTHORIZED = 0, 1, 2, 3, 4
PROG = "twinectl"


class CliError(Exception):
    """Ends the command with `twinectl: <message>` on stderr and `code`."""

    def __init__(self, code: int, message: str):
        self.code, self.message = code, message
        super().__init__(message)


def exit_code_for_status(status: int) -> int:
    """The exit code for a daemon's HTTP status (see the module docstring)."""
    if status < 400:
        return EXIT_OK
    if status == 400:
        return EXIT_INPUT
    if status in (401, 403):
        return EXIT_UNAUTHORIZED
    return EXIT_FAILED


def error_message(status: int, body: Any, text: str = "") -> str:
    """`<field>: <why>` (or `<why>`) from an error body {"error", "field", "why"}; for a body of
    another shape (a proxy's HTML page, say) the status and the start of the text."""
    if isinstance(body, dict) and body.get("why"):
        field = body.get("field")
        return f"{field}: {body['why']}" if field else str(body["why"])
    if isinstance(body, dict) and body.get("error"):
        return f"{body['error']} (HTTP {status})"
    snippet = " ".join(text.split())[:200]
    return f"HTTP {status}" + (f": {snippet}" if snippet else "")


class ApiError(CliError):
    """The daemon answered with an error status."""

    def __init__(self, status: int, body: Any, text: str = ""):
        self.status, self.body = status, body
        super().__init__(exit_code_for_status(status), error_message(status, body, text))


# --- HTTP -----------------------------------------------------------------------------------


class Api:
    """The daemon's REST API over one aiohttp session: `await api.call("GET", "/v1/jobs")`."""

    def __init__(self, url: str, token: str | None, timeout: float, tls: ssl.SSLContext | None = None):
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout
        self.tls = tls  # how an https daemon is verified (None: the system's CAs)
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        headers = {"Accept": "application/json", "User-Agent": PROG}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self.session = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout),
                                             connector=aiohttp.TCPConnector(ssl=self.tls or True))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def call(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Any:
        assert self.session is not None
        where = f"twine-controld at {self.url}"
        try:
            async with self.session.request(method, self.url + path, json=body, params=params) as r:
                status, text = r.status, await r.text(errors="replace")
        except aiohttp.InvalidURL as e:
            raise CliError(EXIT_INPUT, f"--url: {self.url!r} is not a valid URL: {e}") from None
        except aiohttp.ClientConnectorCertificateError as e:
            raise CliError(EXIT_UNREACHABLE, f"cannot trust {where}: {e.certificate_error.verify_message or e} "
                                             "(give its CA with --ca or TWINE_CA)") from None
        except aiohttp.ClientConnectorSSLError as e:
            raise CliError(EXIT_UNREACHABLE, f"no TLS session with {where}: {e.os_error} "
                                             "(is it served over TLS? https:// needs --tls-cert on the daemon)") from None
        except aiohttp.ClientConnectorError as e:
            raise CliError(EXIT_UNREACHABLE, f"cannot reach {where}: {_os_reason(e.os_error)}") from None
        except TimeoutError:
            raise CliError(EXIT_UNREACHABLE, f"{where} did not answer within {self.timeout:g}s (--timeout)") from None
        except aiohttp.ClientError as e:
            raise CliError(EXIT_UNREACHABLE, f"lost the connection to {where}: {e or type(e).__name__}") from None
        try:
            data = json.loads(text) if text.strip() else None
        except ValueError:
            data = None
            if status < 400:
                raise CliError(EXIT_FAILED, f"{method} {path}: {where} answered HTTP {status} with no JSON: "
                                            f"{' '.join(text.split())[:200]}") from None
        if status >= 400:
            raise ApiError(status, data, text)
        return data


def _os_reason(e: OSError) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (is twine-controld running? check --url / TWINE_URL)"
    return e.strerror or str(e) or type(e).__name__


def entitlement_query(args) -> dict[str, str] | None:
    """`--entitlement E` as the query parameter the list and plan answers filter by."""
    return {"entitlement": args.entitlement} if getattr(args, "entitlement", None) else None


def split_handle(handle: str) -> str:
    """`ent/name` -> the URL path `ent/name` (each part quoted). Bad handles are exit 2."""
    ent, sep, name = handle.partition("/")
    if not (sep and ent and name) or "/" in name:
        raise CliError(EXIT_INPUT, f"{handle!r} is not a job handle <entitlement>/<name>")
    return f"{quote(ent, safe='')}/{quote(name, safe='')}"


def quoted(name: str) -> str:
    return quote(name, safe="")
