#!/usr/bin/env bash
# Set up, then bring up a local region on this machine: etcd, twine-controld, and three twine-agents
# each in its own network namespace (two data centers, three MSBs). Create an entitlement with the
# `web` host profile, deploy examples/job.yaml through twinectl, and show where its tasks run. Then
# stop the job (its machines go back to the free pool) and tear the region down.
# `--keep` leaves the region running (stop it with: .venv/bin/python -m controlplane.devregion down --dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
keep=0; [ "${1:-}" = --keep ] && keep=1

work=$(mktemp -d /tmp/twine-region.XXXXXX)
py=.venv/bin/python
down() { [ $keep = 1 ] || $py -m controlplane.devregion down --dir "$work" >/dev/null || true; }
trap down EXIT

echo "== bringing up a local region in $work"
$py -m controlplane.devregion up --dir "$work" | sed -n '1,8p'
url=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["url"])' "$work/region.json")
export TWINE_URL=$url TWINE_CA=$work/pki/ca.pem TWINE_TOKEN_FILE=$work/api-token
ctl() { echo; echo "\$ twinectl $*"; .venv/bin/twinectl "$@"; }

ctl machine list
ctl entitlement create web --machine-type generic --quota 3 --profile web
# the job's owner deploys with a token scoped to its entitlement, not the region's admin token
(umask 077; .venv/bin/twinectl --json token create --role owner --entitlement web --description "demo owner" \
  | $py -c 'import json,sys; print(json.load(sys.stdin)["token"])' > "$work/owner-token")
echo; echo "\$ twinectl token create --role owner --entitlement web   # -> $work/owner-token"
export TWINE_TOKEN_FILE=$work/owner-token
ctl job run examples/job.yaml --wait 120
ctl machine list
ctl discovery web/hello
echo; echo "== the task containers in Docker (one per machine, spread over dc and msb)"
docker ps --filter "label=twine.job=web/hello" --format 'table {{.Names}}\t{{.Label "twine.machine"}}\t{{.Status}}'
first=$(docker ps -q --filter "label=twine.job=web/hello" | head -n1)
sleep 2; echo; echo "== last log line of $first"; docker logs --tail 1 "$first"
ctl job usage web/hello                   # what its tasks use (their cgroups, as the agents measure them)
ctl fleet --by dc,entitlement             # the region at a glance (also at $url/ui/)
ctl rebalance plan                        # what the ReBalancer would move, and why (a dry run)

if [ $keep = 1 ]; then
  echo; echo "region left running: export TWINE_URL=$url TWINE_CA=$work/pki/ca.pem TWINE_TOKEN_FILE=$work/owner-token; .venv/bin/twinectl job status web/hello"
  echo "stop it with: $py -m controlplane.devregion down --dir $work"
  exit 0
fi
ctl job stop web/hello --wait 120
ctl entitlement show web
down
left=$(docker ps -aq --filter "label=twine.job=web/hello" | wc -l)
echo; echo "demo done: region stopped, $left container(s) left (logs in $work/logs)"
