"""The fleet page at /ui/ (issue #25): static files, ours (controlplane/frontend/ui/) and uPlot's
(the npm package scripts/setup.sh installs under ui/node_modules; never copied into the
repository), served without a token: the page holds no data. It asks for a token once, keeps it in
the tab's sessionStorage and calls the API with it; every answer comes summed from the server.

Every response carries a strict Content-Security-Policy: scripts, styles and connections from this
origin only, no inline script or style, no frames, nothing from elsewhere (the page works offline)."""

from __future__ import annotations

import os
from pathlib import Path

from aiohttp import web

HERE = Path(__file__).resolve().parent / "ui"
# the icon: declared by the page, or Chromium asks for /favicon.ico, which the API answers 401
OURS = {"index.html": "text/html", "app.js": "text/javascript", "app.css": "text/css", "favicon.svg": "image/svg+xml"}
VENDOR = {"uPlot.iife.min.js": "text/javascript", "uPlot.min.css": "text/css"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache", "X-Frame-Options": "DENY"}


def vendor_dirs() -> list[Path]:
    """Where uPlot's files may be: $TWINE_UI_ASSETS, the checkout's ui/node_modules (scripts/setup.sh),
    an installed host's /usr/share/twine/ui."""
    out = [Path(os.environ["TWINE_UI_ASSETS"])] if os.environ.get("TWINE_UI_ASSETS") else []
    return out + [HERE.parents[2] / "ui" / "node_modules" / "uplot" / "dist", Path("/usr/share/twine/ui/uplot")]


def _file(path: Path, kind: str) -> web.Response:
    try:
        body = path.read_bytes()
    except OSError:
        return web.Response(status=404, text=f"{path.name}: not installed here (scripts/setup.sh installs the "
                            "page's charting library with npm)", headers=HEADERS)
    return web.Response(body=body, content_type=kind, headers=HEADERS)


async def index(request: web.Request) -> web.Response:
    return _file(HERE / "index.html", OURS["index.html"])


async def redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound("/ui/", headers=HEADERS)


async def ours(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in OURS:
        return web.Response(status=404, text=f"no {name} here", headers=HEADERS)
    return _file(HERE / name, OURS[name])


async def vendor(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in VENDOR:
        return web.Response(status=404, text=f"no {name} here", headers=HEADERS)
    for d in vendor_dirs():
        if (d / name).is_file():
            return _file(d / name, VENDOR[name])
    return _file(vendor_dirs()[-1] / name, VENDOR[name])  # the 404 that says how to install it


def add_routes(app: web.Application) -> None:
    app.router.add_get("/ui", redirect)
    app.router.add_get("/ui/", index)
    app.router.add_get("/ui/vendor/{name}", vendor)
    app.router.add_get("/ui/{name}", ours)
