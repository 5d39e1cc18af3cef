"""Profile files: TOML in `profiles/`, found by name or path, with `include` of a parent.

    [profile]
    description = "web tier"
    include = "default"          # or a list; parents apply first, the child overrides per key

    [sysctl]
    "net.core.somaxconn" = 4096

A child section overrides its parent's section key by key; a key set to "" (or to
`{ unset = true }`) in a child drops the parent's setting.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from agent.errors import ProfileError
from agent.profiles import appliers
from agent.profiles.appliers.base import HostContext
from agent.profiles.model import Profile, Setting


def default_search_path() -> tuple[Path, ...]:
    repo = Path(__file__).resolve().parents[2] / "profiles"
    return (Path("/etc/twine/profiles"), repo)


class ProfileName(str):
    """A profile's name as the control plane gives it: looked up in the profile directories
    only, never taken as a path (a name from the network must not reach any file of the host)."""


def locate(name_or_file: str, search: tuple[Path, ...] | None = None) -> Path:
    """A path as given, or `NAME` looked up as NAME.toml in the search path (a ProfileName: only
    that, whatever it looks like)."""
    p = Path(name_or_file)
    if isinstance(name_or_file, ProfileName):
        if not name_or_file or "/" in name_or_file or "\0" in name_or_file or name_or_file.startswith("."):
            raise ProfileError(name_or_file, "profile", name_or_file, "a profile's name, not a path: looked up only "
                               "as NAME.toml in the profile directories")
    elif p.suffix == ".toml" or "/" in name_or_file:
        if not p.is_file():
            raise ProfileError(name_or_file, "file", name_or_file, "no such profile file")
        return p
    for d in search or default_search_path():
        f = d / f"{name_or_file}.toml"
        if f.is_file():
            return f
    where = ", ".join(str(d) for d in (search or default_search_path()))
    raise ProfileError(name_or_file, "profile", name_or_file, f"no profile of that name in {where}")


MAX_PROFILE_BYTES = 1024 * 1024


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PROFILE_BYTES + 1)
        if len(raw) > MAX_PROFILE_BYTES:
            raise ProfileError(str(path), "file", path.name, f"larger than {MAX_PROFILE_BYTES} bytes")
        return tomllib.loads(raw.decode())
    except UnicodeDecodeError as e:
        raise ProfileError(str(path), "file", path.name, f"not UTF-8 text: {e}") from None
    except RecursionError:
        raise ProfileError(str(path), "file", path.name, "not valid TOML: nested too deep") from None
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(str(path), "file", path.name, f"not valid TOML: {e}") from None
    except OSError as e:
        raise ProfileError(str(path), "file", path.name, e.strerror or str(e)) from None


def _merge(parent: Profile, child: dict[str, dict], child_file: str) -> tuple[dict, dict]:
    out = {name: dict(section) for name, section in parent.sections.items()}
    origins = dict(parent.origins)
    for name, section in child.items():
        merged = out.setdefault(name, {})
        for key, value in section.items():
            if value == "" or (isinstance(value, dict) and value.get("unset") is True):
                merged.pop(key, None)
                origins.pop((name, key), None)
            else:
                merged[key] = value
                origins[(name, key)] = child_file
    return out, origins


def load(name_or_file: str, search: tuple[Path, ...] | None = None, _seen: tuple[Path, ...] = ()) -> Profile:
    """Read a profile and its parents into one merged Profile. Validates structure, not values."""
    path = locate(name_or_file, search).resolve()
    if path in _seen:
        chain = " -> ".join(p.name for p in (*_seen, path))
        raise ProfileError(str(path), "[profile] include", name_or_file, f"include cycle: {chain}")
    data = _read(path)
    meta = data.pop("profile", {})
    if not isinstance(meta, dict):
        raise ProfileError(str(path), "[profile]", meta, "must be a table")
    unknown_meta = set(meta) - {"name", "description", "include"}
    if unknown_meta:
        raise ProfileError(str(path), "[profile]", sorted(unknown_meta), "unknown keys (known: name, description, include)")
    _check_sections(str(path), data)
    includes = meta.get("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ProfileError(str(path), "[profile] include", includes, "must be a profile name or a list of names")
    acc = Profile(name="", files=())
    parent_search = (path.parent, *(search or default_search_path()))
    for inc in includes:
        parent = load(inc, parent_search, (*_seen, path))
        sections, origins = _merge(acc, parent.sections, "")
        origins.update(parent.origins)
        files = acc.files + tuple(f for f in parent.files if f not in acc.files)
        acc = Profile(name="", files=files, sections=sections, origins=origins)
    sections, origins = _merge(acc, data, str(path))
    return Profile(
        name=meta.get("name", path.stem),
        files=(*acc.files, str(path)),
        sections=sections,
        origins=origins,
        description=meta.get("description", ""),
    )


def _check_sections(where: str, data: dict) -> None:
    known = appliers.known()
    for section, body in data.items():
        if section not in known:
            raise ProfileError(where, f"[{section}]", body, f"unknown applier; known: {', '.join(known)}")
        if not isinstance(body, dict):
            raise ProfileError(where, f"[{section}]", body, "must be a table")


def from_content(name: str, sections: dict, digest: str) -> Profile:
    """A merged profile sent as content (the control plane's ProfileSpec), validated like a file."""
    where = f"profile {name} from the control plane ({digest[:12]})"
    _check_sections(where, sections)
    return Profile(name=name, files=(where,), sections={k: dict(v) for k, v in sections.items()}, digest=digest)


def settings(profile: Profile, ctx: HostContext) -> list[Setting]:
    """Every setting of the profile, validated, in apply order (applier order, then file order)."""
    out: list[Setting] = []
    for name in sorted(profile.sections, key=lambda n: (appliers.applier_class(n).order, n)):
        applier = appliers.load(name, ctx)
        for key, value in profile.sections[name].items():
            origin = profile.origins.get((name, key), profile.files[-1])
            out.extend(applier.parse({key: value}, origin))
    return out
