"""Where a dev region keeps what it makes, and what it names things: its work directory's files
(state, logs, tokens, the PKI), its agents' machine ids, namespaces, addresses and directories."""

from __future__ import annotations

import shutil
import ssl
import urllib.request
from pathlib import Path

from controlplane.devregion.network import Network
from controlplane.devregion.spec import AgentSpec
from controlplane.security.pki import CA

STATE_FILE = "region.json"
ETCD_USER = "controld-etcd-client"  # controld's etcd client certificate's common name: its etcd user
MEMBER_COUNTS = (1, 3, 5)  # etcd members a region may have


def member_host(i: int) -> str:
    """The loopback address of etcd member i (1-based) of a region's cluster."""
    return f"127.0.0.{10 + i}"


def is_etcd_member(name: str) -> bool:
    return name.startswith("etcd-") and name[5:].isdigit()


class Layout:
    """The paths and names of a Region (region.py), from its work directory, its agents and, once
    it runs, its network's prefix."""

    workdir: Path
    region: str
    etcd_members: int
    specs: dict[str, AgentSpec]
    network: Network | None
    controld_listen: str | None

    @property
    def state_file(self) -> Path:
        return self.workdir / STATE_FILE

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def api_token_file(self) -> Path:
        return self.workdir / "api-token"

    @property
    def bootstrap_token_file(self) -> Path:
        return self.workdir / "bootstrap-token"

    @property
    def secret_key_file(self) -> Path:
        return self.workdir / "secret-keys"

    @property
    def api_token(self) -> str:
        return self.api_token_file.read_text().strip()

    @property
    def url(self) -> str:
        if self.controld_listen is None:
            raise RuntimeError("the region is not started")
        return f"https://{self.controld_listen}"

    @property
    def pki_dir(self) -> Path:
        """The region's own CA and certificates: controld serves https, etcd TLS with client
        certificates; agents, twinectl and the tests verify against ca.pem."""
        return self.workdir / "pki"

    @property
    def ca_file(self) -> Path:
        return self.pki_dir / "ca.pem"

    def tls_context(self) -> ssl.SSLContext:
        """For a client of the region's API (verifies controld's certificate against the CA)."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    def opener(self) -> urllib.request.OpenerDirector:
        """urllib for the region's API: https verified against its CA, no proxy from the environment."""
        return urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                           urllib.request.HTTPSHandler(context=self.tls_context()))

    def _pki(self, name: str) -> tuple[str, str]:
        return str(self.pki_dir / f"{name}.pem"), str(self.pki_dir / f"{name}-key.pem")

    def _make_pki(self) -> None:
        """A new CA for this region; controld's certificate for the bridge address the agents use
        and for loopback; etcd's; controld's client certificate for etcd (its common name is
        controld's etcd user) and etcd's admin's (root: it sets up etcd's auth)."""
        assert self.network is not None
        if self.pki_dir.exists():
            shutil.rmtree(self.pki_dir)
        ca = CA(self.pki_dir, name=f"devregion {self.region} CA", days=30)
        ca.issue("controld", client=True, ips=(self.network.bridge_ip, "127.0.0.1"))
        ca.issue("etcd", ips=("127.0.0.1",))
        for i in range(1, self.etcd_members + 1 if self.etcd_members > 1 else 1):  # a cluster's: for clients and peers
            ca.issue(f"etcd-{i}", ips=(member_host(i),))
        ca.issue(ETCD_USER, server=False)
        ca.issue("root", server=False)

    @property
    def prefix(self) -> str:
        if self.network is None or self.network.prefix is None:
            raise RuntimeError("the region is not started")
        return self.network.prefix

    def machine_id(self, name: str) -> str:
        self._spec(name)
        return f"{self.prefix}-{name}"

    def netns(self, name: str) -> str:
        self._spec(name)
        return f"{self.prefix}-{name}"

    def agent_ip(self, name: str) -> str:
        assert self.network is not None
        return self.network.ip(name)

    def agent_dir(self, name: str) -> Path:
        return self.workdir / "agents" / name

    def state_dir(self, name: str) -> Path:
        return self.agent_dir(name) / "state"

    def log_path(self, name: str) -> Path:
        if name in ("etcd", "controld") or is_etcd_member(name):
            return self.log_dir / f"{name}.log"
        self._spec(name)
        return self.log_dir / f"agent-{name}.log"

    def logs(self, name: str) -> str:
        """The log of `etcd`, `controld` or an agent (by name)."""
        try:
            return self.log_path(name).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _spec(self, name: str) -> AgentSpec:
        try:
            return self.specs[name]
        except KeyError:
            raise KeyError(f"no agent {name!r} in this region (agents: {', '.join(self.specs)})") from None
