"""The agent's configuration: one typed object, from /etc/twine/agent.toml and then flags.

    machine_id = "..."            # default: /etc/machine-id
    state_dir = "/var/lib/twine-agent"
    desired = "/etc/twine/desired.toml"
    listen = "127.0.0.1:7070"     # or "unix:/run/twine-agent.sock"
    task_cgroup = "twine"
    owns_kernel = true
    [labels]
    region = "region1"  dc = "dc1"  msb = "msb1"  rack = "r1"  machine_type = "generic"
"""

from __future__ import annotations

import argparse
import socket
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from agent.errors import InputError

DEFAULT_CONFIG = "/etc/twine/agent.toml"


@dataclass(frozen=True)
class Labels:
    region: str = "region1"
    dc: str = "dc1"
    msb: str = "msb1"
    rack: str = "rack1"
    machine_type: str = "generic"


@dataclass(frozen=True)
class AgentConfig:
    machine_id: str = ""
    hostname: str = field(default_factory=socket.gethostname)
    labels: Labels = field(default_factory=Labels)
    state_dir: Path = Path("/var/lib/twine-agent")
    desired: Path | None = None
    listen: str = "127.0.0.1:7070"
    profiles_path: tuple[Path, ...] = ()
    task_cgroup: str = "twine"
    owns_kernel: bool = True
    reconcile_interval: float = 2.0
    stop_grace: float = 10.0
    health_interval: float = 5.0
    image_pull: str = "if-not-present"  # or "never": use only images already on the host

    def host_context(self):
        from agent.profiles.appliers.base import HostContext

        return HostContext(task_cgroup=self.task_cgroup, owns_kernel=self.owns_kernel)

    def profile_search(self) -> tuple[Path, ...] | None:
        from agent.profiles.loader import default_search_path

        return (*self.profiles_path, *default_search_path())


def read_machine_id() -> str:
    try:
        return Path("/etc/machine-id").read_text().strip()
    except OSError:
        return ""


def _from_file(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise InputError(str(path), "file", path.name, f"not valid TOML: {e}") from None


def _typed(path: str, data: dict) -> dict:
    """Check names and types of the config file's keys against AgentConfig."""
    out: dict = {}
    known = {f.name: f for f in fields(AgentConfig)}
    for key, value in data.items():
        if key == "labels":
            if not isinstance(value, dict):
                raise InputError(path, "labels", value, "must be a table")
            label_names = {f.name for f in fields(Labels)}
            for k, v in value.items():
                if k not in label_names or not isinstance(v, str):
                    raise InputError(path, f"labels.{k}", v, f"unknown label or not a string; known: {', '.join(sorted(label_names))}")
            out["labels"] = Labels(**value)
        elif key not in known:
            raise InputError(path, key, value, f"unknown setting; known: {', '.join(sorted(known))}")
        elif key in ("state_dir", "desired"):
            out[key] = Path(value)
        elif key == "profiles_path":
            out[key] = tuple(Path(p) for p in (value if isinstance(value, list) else [value]))
        elif key in ("reconcile_interval", "stop_grace", "health_interval"):
            if not isinstance(value, (int, float)) or value <= 0:
                raise InputError(path, key, value, "must be a positive number of seconds")
            out[key] = float(value)
        elif key == "image_pull":
            if value not in ("if-not-present", "never"):
                raise InputError(path, key, value, "must be if-not-present or never")
            out[key] = value
        elif key == "owns_kernel":
            if not isinstance(value, bool):
                raise InputError(path, key, value, "must be true or false")
            out[key] = value
        else:
            if not isinstance(value, str):
                raise InputError(path, key, value, "must be a string")
            out[key] = value
    return out


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--desired", help="desired-state file (TOML or JSON), re-read when it changes")
    p.add_argument("--listen", help="HTTP address: HOST:PORT or unix:PATH (default 127.0.0.1:7070)")
    p.add_argument("--machine-id", help="default: /etc/machine-id")
    for label in ("region", "dc", "msb", "rack", "machine-type"):
        p.add_argument(f"--{label}", help=f"machine label {label}")
    p.add_argument("--reconcile-interval", type=float, help="seconds between level-triggered passes")
    p.add_argument("--health-interval", type=float, help="seconds between health probes (default 5)")
    p.add_argument("--image-pull", choices=("if-not-present", "never"), help="when to pull a missing image")
    p.add_argument("--no-kernel", action="store_true", help="another agent on this kernel owns kernel-wide settings")


def load_config(args: argparse.Namespace) -> AgentConfig:
    path = Path(args.config)
    data: dict = {}
    if path.exists():
        data = _typed(str(path), _from_file(path))
    elif args.config != DEFAULT_CONFIG:
        raise InputError(str(path), "--config", str(path), "no such file")
    cfg = replace(AgentConfig(), **data)
    flags: dict = {}
    if getattr(args, "state_dir", None):
        flags["state_dir"] = Path(args.state_dir)
    if getattr(args, "desired", None):
        flags["desired"] = Path(args.desired)
    if getattr(args, "listen", None):
        flags["listen"] = args.listen
    if getattr(args, "machine_id", None):
        flags["machine_id"] = args.machine_id
    if getattr(args, "reconcile_interval", None):
        flags["reconcile_interval"] = args.reconcile_interval
    if getattr(args, "health_interval", None):
        flags["health_interval"] = args.health_interval
    if getattr(args, "image_pull", None):
        flags["image_pull"] = args.image_pull
    if getattr(args, "no_kernel", False):
        flags["owns_kernel"] = False
    label_flags = {
        name.replace("-", "_"): getattr(args, name.replace("-", "_"), None)
        for name in ("region", "dc", "msb", "rack", "machine-type")
    }
    label_flags = {k: v for k, v in label_flags.items() if v}
    if label_flags:
        flags["labels"] = replace(cfg.labels, **label_flags)
    cfg = replace(cfg, **flags)
    if not cfg.machine_id:
        cfg = replace(cfg, machine_id=read_machine_id())
    return cfg
