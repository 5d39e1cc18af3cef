"""The agent's configuration: one typed object, from /etc/twine/agent.toml and then flags.

    machine_id = "..."            # default: /etc/machine-id
    state_dir = "/var/lib/twine-agent"
    desired = "/etc/twine/desired.toml"   # a local file, or (not both) twine-controld:
    # control_plane = ["http://controld1:7000", "http://controld2:7000"]   # replicas of one region
    # bootstrap_token_file = "/etc/twine/bootstrap-token"   # the token is the file's first line
    # control_plane_ca = "/etc/twine/ca.pem"   # https control planes are verified against it (default: system CAs)
    # heartbeat_interval = 1.0
    # address = "10.0.0.5:7070"   # advertised to the control plane; default: listen
    # cpus = 8                    # capacity claimed at registration; default: the host's
    # memory_mb = 16384
    listen = "127.0.0.1:7070"     # or "unix:/run/twine-agent.sock"
    task_cgroup = "twine"
    owns_kernel = true
    # sysctl_unguarded = ["vm.min_free_kbytes"]   # the operator lifts a guard (agent/profiles/appliers/sysctl.py)
    [labels]
    region = "region1"  dc = "dc1"  msb = "msb1"  rack = "r1"  machine_type = "generic"
"""

from __future__ import annotations

import argparse
import socket
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, Callable, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from agent.decoding import field_and_why, value_at
from agent.errors import InputError

Seconds = Annotated[float, Meta(gt=0, description="a positive number of seconds")]

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
    # sysctls whose guard (values that can take a host down) this host's operator lifts: profiles may
    # then set them to anything the allow-list allows. Only from the agent's own config file.
    sysctl_unguarded: tuple[str, ...] = ()
    reconcile_interval: Seconds = 2.0
    stop_grace: Seconds = 10.0
    health_interval: Seconds = 5.0
    image_pull: Literal["if-not-present", "never"] = "if-not-present"  # never: use only images already on the host
    control_plane: tuple[str, ...] = ()  # URLs of twine-controld replicas of one region; exclusive with `desired`
    bootstrap_token_file: Path | None = None
    control_plane_ca: Path | None = None  # the CA an https control plane's certificate chains to
    heartbeat_interval: Seconds = 1.0
    # capacity overrides for registration (default: the host's)
    cpus: Annotated[float, Meta(gt=0, description="a positive number of CPUs")] | None = None
    memory_mb: Annotated[int, Meta(gt=0, description="MiB")] | None = None
    address: str = ""  # advertised to the control plane; default: listen

    def bootstrap_token(self) -> str:
        """The first line of bootstrap_token_file. InputError when it is unset, unreadable or empty."""
        path = self.bootstrap_token_file
        if path is None:
            raise InputError("config", "bootstrap_token_file", None, "--control-plane needs --bootstrap-token-file")
        try:
            lines = path.read_text().splitlines()
        except OSError as e:
            raise InputError(str(path), "bootstrap_token_file", str(path), e.strerror or str(e)) from None
        token = lines[0].strip() if lines else ""
        if not token:
            raise InputError(str(path), "bootstrap_token_file", str(path), "the first line (the token) is empty")
        return token

    def host_context(self):
        from agent.profiles.appliers.base import HostContext

        return HostContext(task_cgroup=self.task_cgroup, owns_kernel=self.owns_kernel,
                           sysctl_unguarded=frozenset(self.sysctl_unguarded))

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


def _check_url(where: str, field_: str, value: object) -> str:
    """An http(s) URL with a host, without a trailing slash."""
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(where, field_, value, "must be an http:// or https:// URL")
    return value.rstrip("/")


def control_plane_urls(where: str, field_: str, value: object) -> tuple[str, ...]:
    """One URL, URLs separated by commas, or (from TOML) a list of them: the replicas of one region,
    tried in this order. InputError names the URL that is wrong."""
    if isinstance(value, str):
        items: list[object] = [u.strip() for u in value.split(",")]
    elif isinstance(value, list):
        items = [u.strip() if isinstance(u, str) else u for u in value]
    else:
        raise InputError(where, field_, value, "must be a URL or a list of URLs")
    if not items:
        raise InputError(where, field_, value, "needs at least one URL")
    urls: list[str] = []
    for item in items:
        if item == "":
            raise InputError(where, field_, value, "an empty URL in the list (a stray comma?)")
        url = _check_url(where, field_, item)
        if url in urls:
            raise InputError(where, field_, item, "listed twice")
        urls.append(url)
    return tuple(urls)


def _positive(kind: type) -> Callable[[str], float]:
    """An argparse type: a number of `kind` above zero."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
        return value

    return parse


def _path(type_: type, value: object) -> object:
    """msgspec's hook for the config's paths: given as strings."""
    if type_ is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError


def _typed(path: str, data: dict) -> AgentConfig:
    """The config file's keys decoded into AgentConfig by its fields' types and bounds (msgspec);
    InputError names the key that is unknown or wrong."""
    known = {f.name for f in fields(AgentConfig)}
    label_names = {f.name for f in fields(Labels)}
    for key, value in data.items():
        if key not in known:
            raise InputError(path, key, value, f"unknown setting; known: {', '.join(sorted(known))}")
    labels = data.get("labels", {})
    for k, v in labels.items() if isinstance(labels, dict) else ():
        if k not in label_names:
            raise InputError(path, f"labels.{k}", v, f"unknown label; known: {', '.join(sorted(label_names))}")
    given = dict(data)
    if "control_plane" in given:  # one URL, or a list of them: each checked (control_plane_urls)
        given["control_plane"] = control_plane_urls(path, "control_plane", given["control_plane"])
    if isinstance(given.get("profiles_path"), str):
        given["profiles_path"] = [given["profiles_path"]]
    try:
        cfg = msgspec.convert(given, AgentConfig, strict=True, dec_hook=_path)
    except msgspec.ValidationError as e:
        key, why = field_and_why(given, e)
        raise InputError(path, key or "(top level)", value_at(given, key), why) from None
    if cfg.sysctl_unguarded:
        from agent.profiles.appliers.sysctl import GUARDED_NAMES, is_guarded

        unknown = [v for v in cfg.sysctl_unguarded if not is_guarded(v)]
        if unknown:
            raise InputError(path, "sysctl_unguarded", unknown[0], f"not a guarded sysctl; guarded: {GUARDED_NAMES}")
    return cfg


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
    p.add_argument("--control-plane", metavar="URL[,URL...]",
                   help="take the desired state from twine-controld (not with --desired); several replicas of "
                        "one region: comma-separated, tried in order, the next one when one fails")
    p.add_argument("--bootstrap-token-file", metavar="FILE", help="registration token for --control-plane: the file's first line")
    p.add_argument("--control-plane-ca", metavar="FILE",
                   help="CA bundle (PEM) an https --control-plane's certificate must chain to (default: the system's CAs)")
    p.add_argument("--heartbeat-interval", type=_positive(float), help="seconds between heartbeats (default 1)")
    p.add_argument("--cpus", type=_positive(float), help="CPUs to register (default: the host's)")
    p.add_argument("--memory-mb", type=_positive(int), help="memory in MiB to register (default: the host's)")
    p.add_argument("--address", help="address advertised to the control plane (default: --listen)")


def load_config(args: argparse.Namespace) -> AgentConfig:
    path = Path(args.config)
    cfg = AgentConfig()
    if path.exists():
        cfg = _typed(str(path), _from_file(path))
    elif args.config != DEFAULT_CONFIG:
        raise InputError(str(path), "--config", str(path), "no such file")
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
    if getattr(args, "control_plane", None):
        flags["control_plane"] = control_plane_urls("command line", "--control-plane", args.control_plane)
    if getattr(args, "bootstrap_token_file", None):
        flags["bootstrap_token_file"] = Path(args.bootstrap_token_file)
    if getattr(args, "control_plane_ca", None):
        flags["control_plane_ca"] = Path(args.control_plane_ca)
    for name in ("heartbeat_interval", "cpus", "memory_mb", "address"):
        if getattr(args, name, None):
            flags[name] = getattr(args, name)
    label_flags = {
        name.replace("-", "_"): getattr(args, name.replace("-", "_"), None)
        for name in ("region", "dc", "msb", "rack", "machine-type")
    }
    label_flags = {k: v for k, v in label_flags.items() if v}
    if label_flags:
        flags["labels"] = replace(cfg.labels, **label_flags)
    cfg = replace(cfg, **flags)
    if cfg.desired is not None and cfg.control_plane:
        raise InputError(
            "config", "--desired/--control-plane", f"{cfg.desired} / {','.join(cfg.control_plane)}",
            "--desired and --control-plane are mutually exclusive: take the desired state from one",
        )
    if not cfg.machine_id:
        cfg = replace(cfg, machine_id=read_machine_id())
    return cfg
