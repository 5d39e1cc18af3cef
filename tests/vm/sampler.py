"""A test's watch on a rollout, run inside the region's namespace (vmenv.sh exec) as one process:
about every second, the job's task states and the rollout's machine phases from controld's API,
one JSON line each on stdout ({"error": ...} for a sample that failed). Asking twinectl twice a
second cost two process starts and two port probes a second on a host whose two cores also run
every guest.

    python sampler.py URL CA TOKEN_FILE ENTITLEMENT JOB"""

from __future__ import annotations

import json
import ssl
import sys
import time
import urllib.parse
import urllib.request


def main() -> None:
    url, ca, token_file, ent, job = sys.argv[1:6]
    with open(token_file) as f:
        token = f.read().strip()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=ca)))

    def get(path: str) -> dict:
        req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
        with opener.open(req, timeout=30) as r:
            return json.loads(r.read())

    e, j = urllib.parse.quote(ent, safe=""), urllib.parse.quote(job, safe="")
    while True:
        try:
            tasks = get(f"/v1/jobs/{e}/{j}")["tasks"]
            rollout = get(f"/v1/entitlements/{e}/rollout")
            out: dict = {"tasks": [t["state"] for t in tasks], "phases": [m["phase"] for m in rollout["machines"]]}
        except Exception as ex:  # noqa: BLE001 - a slow or odd answer: said, and the next sample
            out = {"error": f"{type(ex).__name__}: {str(ex)[-300:]}"}
        print(json.dumps(out), flush=True)
        time.sleep(1)


if __name__ == "__main__":
    main()
