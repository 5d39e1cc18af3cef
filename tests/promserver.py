"""Debian's Prometheus server, run by a test: it scrapes one twine-controld over TLS with a token
every second; `query` asks its query API. Stopped by `close` (or the with-block)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.agent.agentproc import free_port

PROMETHEUS = shutil.which("prometheus")


class PrometheusServer:
    def __init__(self, tmp: Path, target: str, token: str, ca: Path):
        assert PROMETHEUS, "Debian's prometheus is not installed: scripts/setup.sh installs it"
        tmp.mkdir(parents=True, exist_ok=True)
        token_file = tmp / "prometheus-token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        self.port = free_port()
        self.log = tmp / "prometheus.log"
        config = tmp / "prometheus.yml"
        config.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: twine-controld
    scheme: https
    metrics_path: /v1/metrics
    authorization: {{type: Bearer, credentials_file: {token_file}}}
    tls_config: {{ca_file: {ca}}}
    static_configs: [{{targets: ["{target}"]}}]
""")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                          f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log,
                                         stderr=subprocess.STDOUT)

    def __enter__(self) -> "PrometheusServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def query(self, expr: str) -> list:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)["data"]["result"]

    def wait(self, expr: str, predicate=bool, timeout: float = 60) -> list:
        """The query's result once predicate(result) holds; AssertionError with the log's tail if not in time."""
        deadline, got = time.time() + timeout, []
        while time.time() < deadline:
            try:
                got = self.query(expr)
            except OSError:
                got = []
            if predicate(got):
                return got
            time.sleep(0.5)
        raise AssertionError(f"{expr}: {got} after {timeout} s; prometheus said: {self.log.read_text()[-2000:]}")
