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
. scripts/demo-lib.sh

echo "== bringing up a local region in $work (the SRM passes every 2 s, heartbeat timeout 3 s)"
region_up --heartbeat-timeout 3 --controld-arg=--srm-interval --controld-arg=2 --controld-arg=--usage-sample \
  --controld-arg=1

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

finish $keep
