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
. scripts/demo-lib.sh

echo "== bringing up a local region in $work (the SRM passes every 2 s)"
region_up --controld-arg=--srm-interval --controld-arg=2 --controld-arg=--usage-sample --controld-arg=1

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

finish $keep
