#!/usr/bin/env bash
# Paper Figure 18 on this machine: a local region (etcd, twine-controld running the SRM every 2 s, four
# twine-agents in network namespaces, one 1 GiB machine each), two entitlements with different host
# profiles, `web` (net.core.somaxconn 16384) and `batch` (net.ipv4.tcp_slow_start_after_idle 0), and
# an autoscaled job in each (examples/autoscale-*.yaml) whose tasks burn CPU while a load knob says so.
# Night: web idles and shrinks, its machines go back to the free pool, batch grows onto them and they
# take batch's kernel settings. Day: the reverse. Each step shows the jobs, the SRM's reasons, and
# each machine's entitlement and kernel values, read in its namespace.
# `--keep` leaves the region running (stop it with: .venv/bin/python -m controlplane.devregion down --dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
keep=0; [ "${1:-}" = --keep ] && keep=1

work=$(mktemp -d /tmp/twine-autoscale.XXXXXX)
py=.venv/bin/python
knobs_pid=
down() {
  [ -n "$knobs_pid" ] && kill "$knobs_pid" 2>/dev/null || true
  [ $keep = 1 ] || $py -m controlplane.devregion down --dir "$work" >/dev/null || true
}
trap down EXIT

cat > "$work/agents.json" <<'JSON'
[{"name": "a0", "dc": "dc1", "msb": "msb0", "rack": "rack0", "cpus": 2.0, "memory_mb": 1024},
 {"name": "a1", "dc": "dc1", "msb": "msb1", "rack": "rack1", "cpus": 2.0, "memory_mb": 1024},
 {"name": "a2", "dc": "dc2", "msb": "msb2", "rack": "rack2", "cpus": 2.0, "memory_mb": 1024},
 {"name": "a3", "dc": "dc2", "msb": "msb3", "rack": "rack3", "cpus": 2.0, "memory_mb": 1024}]
JSON
echo "== bringing up a local region in $work (the SRM passes every 2 s)"
$py -m controlplane.devregion up --dir "$work" --agents "$work/agents.json" \
  --controld-arg=--srm-interval --controld-arg=2 --controld-arg=--usage-sample --controld-arg=1 | sed -n '1,6p'
url=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["url"])' "$work/region.json")
export TWINE_URL=$url TWINE_CA=$work/pki/ca.pem TWINE_TOKEN_FILE=$work/api-token
ctl() { echo; echo "\$ twinectl $*"; .venv/bin/twinectl "$@"; }

# the load knobs: each job's running containers get /tmp/busy while its knob file says 1
echo 0 > "$work/knob-web"; echo 0 > "$work/knob-batch"
(while :; do
   for pair in web/api:web batch/work:batch; do
     job=${pair%%:*}; on=$(cat "$work/knob-${pair##*:}")
     for c in $(docker ps -q --filter "label=twine.job=$job"); do
       if [ "$on" = 1 ]; then docker exec "$c" touch /tmp/busy; else docker exec "$c" rm -f /tmp/busy; fi >/dev/null 2>&1 || true
     done
   done
   sleep 1
 done) &
knobs_pid=$!

machines() {  # each machine: its entitlement, applied profile and the two kernel values in its namespace
  $py - "$work" <<'PY'
import json, sys, urllib.request
from controlplane.devregion import Region
r = Region.from_dir(sys.argv[1])
req = urllib.request.Request(r.url + "/v1/machines", headers={"Authorization": "Bearer " + r.api_token})
ms = {m["id"]: m for m in json.load(urllib.request.urlopen(req, context=r.tls_context()))["machines"]}
print(f"{'AGENT':6} {'ENTITLEMENT':12} {'PROFILE':8} {'somaxconn':>9} {'tcp_slow_start_after_idle':>26}")
for name in sorted(r.specs):
    m = ms[r.machine_id(name)]
    vals = [r.netns_exec(name, "cat", p).stdout.strip() for p in
            ("/proc/sys/net/core/somaxconn", "/proc/sys/net/ipv4/tcp_slow_start_after_idle")]
    print(f"{name:6} {m['entitlement'] or '(free)':12} {m['profile']['applied'] or '-':8} {vals[0]:>9} {vals[1]:>26}")
PY
}
settle() {  # wait until web runs $1 tasks and batch $2, each on machines its profile is applied on
  for _ in $(seq 180); do
    if $py - "$1" "$2" <<'PY'
import json, os, sys, urllib.request, ssl
ctx = ssl.create_default_context(cafile=os.environ["TWINE_CA"])
tok = open(os.environ["TWINE_TOKEN_FILE"]).read().strip()
get = lambda p: json.load(urllib.request.urlopen(urllib.request.Request(os.environ["TWINE_URL"] + p,
                          headers={"Authorization": "Bearer " + tok}), context=ctx))
ms = {m["id"]: m for m in get("/v1/machines")["machines"]}
ok = True
for handle, want in (("web/api", int(sys.argv[1])), ("batch/work", int(sys.argv[2]))):
    j = get("/v1/jobs/" + handle)
    run = [t for t in j["tasks"] if t["state"] == "running"]
    ok &= j["count"] == want and len(run) == want and all(ms[t["machine"]]["profile"]["applied"] == j["entitlement"] for t in run)
sys.exit(0 if ok else 1)
PY
    then return 0; fi
    sleep 1
  done
  echo "did not settle at web $1, batch $2" >&2; return 1
}

ctl entitlement create web --machine-type generic --quota 4 --profile web
ctl entitlement create batch --machine-type generic --quota 4 --profile batch
ctl job run examples/autoscale-web.yaml
ctl job run examples/autoscale-batch.yaml
settle 1 1
echo; echo "== both idle: one task each"; machines

echo; echo "== night: web idles, batch gets busy (its knob on)"
echo 1 > "$work/knob-batch"
settle 1 3
ctl job autoscale batch/work
echo; machines

echo; echo "== day: web gets busy, batch idles: batch's machines go back to the pool, web takes them"
echo 1 > "$work/knob-web"; echo 0 > "$work/knob-batch"
settle 3 1
ctl job autoscale web/api
ctl job autoscale batch/work
echo; machines
ctl fleet --by entitlement

if [ $keep = 1 ]; then
  echo; echo "region left running: export TWINE_URL=$url TWINE_CA=$work/pki/ca.pem TWINE_TOKEN_FILE=$work/api-token"
  echo "the fleet page: $url/ui/#/job/web/api ; stop it with: $py -m controlplane.devregion down --dir $work"
  exit 0
fi
ctl job stop web/api --wait 60
ctl job stop batch/work --wait 60
echo; echo "demo done (logs in $work/logs)"
