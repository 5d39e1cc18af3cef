#!/usr/bin/env bash
# Opportunistic capacity on this machine (issue #37): a local region (etcd, twine-controld running the
# SRM every 2 s, four twine-agents in network namespaces, one 1 GiB machine each, one MSB each).
# `web` is guaranteed and autoscaled (examples/autoscale-web.yaml, profile web: net.core.somaxconn
# 16384); `batch` is opportunistic (examples/capacity-batch.yaml, profile batch:
# net.ipv4.tcp_slow_start_after_idle 0, 60 s notice) with the batch TaskController, which acks a
# reclaim 3 s after its notice (its "checkpoint"). Batch fills the machines web does not use. Day:
# web's load rises, the SRM grows it, its new tasks find no free machine, so batch's machines are
# reclaimed: notices, acks, batch's tasks stop long before the deadline, web's start there under
# web's profile. Then web's MSB is lost: its task runs again on batch's last machine, reclaimed
# without notice (a failure). Each step shows the machines, `twinectl capacity` and its SLO view.
# `--keep` leaves the region running (stop it with: .venv/bin/python -m controlplane.devregion down --dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
keep=0; [ "${1:-}" = --keep ] && keep=1

work=$(mktemp -d /tmp/twine-capacity.XXXXXX)
py=.venv/bin/python
knobs_pid= controller_pid=
down() {
  [ -n "$knobs_pid" ] && kill "$knobs_pid" 2>/dev/null || true
  [ -n "$controller_pid" ] && kill "$controller_pid" 2>/dev/null || true
  [ $keep = 1 ] || $py -m controlplane.devregion down --dir "$work" >/dev/null || true
}
trap down EXIT

cat > "$work/agents.json" <<'JSON'
[{"name": "a0", "dc": "dc1", "msb": "msb0", "rack": "rack0", "cpus": 2.0, "memory_mb": 1024},
 {"name": "a1", "dc": "dc1", "msb": "msb1", "rack": "rack1", "cpus": 2.0, "memory_mb": 1024},
 {"name": "a2", "dc": "dc2", "msb": "msb2", "rack": "rack2", "cpus": 2.0, "memory_mb": 1024},
 {"name": "a3", "dc": "dc2", "msb": "msb3", "rack": "rack3", "cpus": 2.0, "memory_mb": 1024}]
JSON
echo "== bringing up a local region in $work (the SRM passes every 2 s, heartbeat timeout 3 s)"
$py -m controlplane.devregion up --dir "$work" --agents "$work/agents.json" --heartbeat-timeout 3 \
  --controld-arg=--srm-interval --controld-arg=2 --controld-arg=--usage-sample --controld-arg=1 | sed -n '1,6p'
url=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["url"])' "$work/region.json")
export TWINE_URL=$url TWINE_CA=$work/pki/ca.pem TWINE_TOKEN_FILE=$work/api-token
ctl() { echo; echo "\$ twinectl $*"; .venv/bin/twinectl "$@"; }

$py -m controlplane.taskcontrol.controllers.batch --listen 127.0.0.1:9091 --checkpoint 3 > "$work/logs/batch-controller.log" 2>&1 &
controller_pid=$!

# web's load knob: its running containers get /tmp/busy (they burn their CPU share) while it says 1
echo 0 > "$work/knob-web"
(while :; do
   on=$(cat "$work/knob-web")
   for c in $(docker ps -q --filter "label=twine.job=web/api"); do
     if [ "$on" = 1 ]; then docker exec "$c" touch /tmp/busy; else docker exec "$c" rm -f /tmp/busy; fi >/dev/null 2>&1 || true
   done
   sleep 1
 done) &
knobs_pid=$!

machines() {  # each machine: its entitlement, applied profile, the task running there, the two kernel values
  $py - "$work" <<'PY'
import json, sys, urllib.request
from controlplane.devregion import Region
r = Region.from_dir(sys.argv[1])
get = lambda p: json.load(urllib.request.urlopen(urllib.request.Request(r.url + p, headers={
    "Authorization": "Bearer " + r.api_token}), context=r.tls_context()))
ms = {m["id"]: m for m in get("/v1/machines")["machines"]}
on = {t["machine"]: f"{h}#{t['index']}" for h in ("web/api", "batch/work") for t in get("/v1/jobs/" + h)["tasks"]
      if t["state"] == "running"}
print(f"{'AGENT':6} {'HEALTHY':7} {'ENTITLEMENT':12} {'PROFILE':8} {'RUNNING':13} {'somaxconn':>9} {'slow_start':>10}")
for name in sorted(r.specs):
    m = ms[r.machine_id(name)]
    vals = [r.netns_exec(name, "cat", p).stdout.strip() for p in
            ("/proc/sys/net/core/somaxconn", "/proc/sys/net/ipv4/tcp_slow_start_after_idle")]
    print(f"{name:6} {str(m['healthy']).lower():7} {m['entitlement'] or '(free)':12} {m['profile']['applied'] or '-':8} "
          f"{on.get(m['id'], '-'):13} {vals[0]:>9} {vals[1]:>10}")
PY
}
settle() {  # wait until web runs $1 tasks and batch $2 (running), each on machines its profile is applied on
  for _ in $(seq 240); do
    if $py - "$1" "$2" <<'PY'
import json, os, sys, urllib.request, ssl
ctx = ssl.create_default_context(cafile=os.environ["TWINE_CA"])
tok = open(os.environ["TWINE_TOKEN_FILE"]).read().strip()
get = lambda p: json.load(urllib.request.urlopen(urllib.request.Request(os.environ["TWINE_URL"] + p,
                          headers={"Authorization": "Bearer " + tok}), context=ctx))
ms = {m["id"]: m for m in get("/v1/machines")["machines"]}
ok = True
for handle, want in (("web/api", int(sys.argv[1])), ("batch/work", int(sys.argv[2]))):
    run = [t for t in get("/v1/jobs/" + handle)["tasks"] if t["state"] == "running"]
    ok &= len(run) == want and all(ms[t["machine"]]["profile"]["applied"] == handle.split("/")[0] for t in run)
sys.exit(0 if ok else 1)
PY
    then return 0; fi
    sleep 1
  done
  echo "did not settle at web $1, batch $2 running" >&2; return 1
}

ctl entitlement create web --machine-type generic --quota 4 --profile web
ctl entitlement create batch --machine-type generic --quota 4 --profile batch --kind opportunistic --notice 60 \
  --allow-controller-network 127.0.0.0/8
ctl job run examples/autoscale-web.yaml
ctl job run examples/capacity-batch.yaml
settle 1 3
echo; echo "== night: web idles on one machine, batch runs on the three others"; machines
ctl capacity forecast

echo; echo "== day: web's load rises; the SRM grows it and batch's machines are reclaimed with 60 s notice"
echo 1 > "$work/knob-web"
began=$(date +%s)
for _ in $(seq 120); do
  .venv/bin/twinectl --json capacity | $py -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["open"] else 1)' && break
  sleep 1
done
ctl capacity
settle 3 1
echo; echo "== web on three machines after $(( $(date +%s) - began )) s; batch acked each reclaim after its 3 s checkpoint"
machines
ctl capacity
grep -h "twine.taskcontrol.batch" "$work/logs/batch-controller.log" || true

lost=$($py - "$work" <<'PY'
import json, sys, urllib.request
from controlplane.devregion import Region
r = Region.from_dir(sys.argv[1])
get = lambda p: json.load(urllib.request.urlopen(urllib.request.Request(r.url + p, headers={
    "Authorization": "Bearer " + r.api_token}), context=r.tls_context()))
web = {t["machine"] for t in get("/v1/jobs/web/api")["tasks"] if t["state"] == "running"}
print(next(s.msb for s in r.specs.values() if r.machine_id(s.name) in web))
PY
)
echo; echo "== MSB $lost lost (every agent of it killed): web's task there runs again on batch's last machine, reclaimed without notice"
cut=$(date +%s)
$py -m controlplane.devregion kill msb "$lost" --dir "$work"
settle 3 0
echo "web running on three machines again $(( $(date +%s) - cut )) s after the loss"
machines
ctl capacity slo
$py -m controlplane.devregion heal msb "$lost" --dir "$work"

if [ $keep = 1 ]; then
  echo; echo "region left running: export TWINE_URL=$url TWINE_CA=$work/pki/ca.pem TWINE_TOKEN_FILE=$work/api-token"
  echo "stop it with: $py -m controlplane.devregion down --dir $work"
  exit 0
fi
ctl job stop web/api --wait 60
ctl job stop batch/work --wait 60
echo; echo "demo done (logs in $work/logs)"
