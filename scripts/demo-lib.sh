# What the two-entitlement demos share (sourced by demo-autoscale.sh and demo-capacity.sh): a local
# region of four namespace machines of 1 GiB, one MSB each, two per dc; twinectl at it; the machines
# shown with their kernel values; and waiting for the jobs to settle. Needs $py and $work set.

region_up() {  # extra controld flags as arguments (each word once: --controld-arg=WORD)
  cat > "$work/agents.json" <<'JSON'
[{"name": "a0", "dc": "dc1", "msb": "msb0", "rack": "rack0", "cpus": 2.0, "memory_mb": 1024},
 {"name": "a1", "dc": "dc1", "msb": "msb1", "rack": "rack1", "cpus": 2.0, "memory_mb": 1024},
 {"name": "a2", "dc": "dc2", "msb": "msb2", "rack": "rack2", "cpus": 2.0, "memory_mb": 1024},
 {"name": "a3", "dc": "dc2", "msb": "msb3", "rack": "rack3", "cpus": 2.0, "memory_mb": 1024}]
JSON
  $py -m controlplane.devregion up --dir "$work" --agents "$work/agents.json" "$@" | sed -n '1,6p'
  url=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["url"])' "$work/region.json")
  export TWINE_URL=$url TWINE_CA=$work/pki/ca.pem TWINE_TOKEN_FILE=$work/api-token
}

ctl() { echo; echo "\$ twinectl $*"; .venv/bin/twinectl "$@"; }

machines() {  # each machine: health, entitlement, applied profile, the task running there, two kernel values
  $py - "$work" <<'PY'
import json, sys, urllib.request
from controlplane.devregion import Region
r = Region.from_dir(sys.argv[1])
get = lambda p: json.load(urllib.request.urlopen(urllib.request.Request(r.url + p, headers={
    "Authorization": "Bearer " + r.api_token}), context=r.tls_context()))
ms = {m["id"]: m for m in get("/v1/machines")["machines"]}
on = {t["machine"]: f"{h}#{t['index']}" for h in ("web/api", "batch/work") for t in get("/v1/jobs/" + h)["tasks"]
      if t["state"] == "running"}
print(f"{'AGENT':6} {'HEALTHY':7} {'ENTITLEMENT':12} {'PROFILE':8} {'RUNNING':13} {'somaxconn':>9} "
      f"{'tcp_slow_start_after_idle':>26}")
for name in sorted(r.specs):
    m = ms[r.machine_id(name)]
    vals = [r.netns_exec(name, "cat", p).stdout.strip() for p in
            ("/proc/sys/net/core/somaxconn", "/proc/sys/net/ipv4/tcp_slow_start_after_idle")]
    print(f"{name:6} {str(m['healthy']).lower():7} {m['entitlement'] or '(free)':12} {m['profile']['applied'] or '-':8} "
          f"{on.get(m['id'], '-'):13} {vals[0]:>9} {vals[1]:>26}")
PY
}

settle() {  # until web runs $1 tasks and batch $2, each on a machine its profile is applied on (an autoscaled
  for _ in $(seq 240); do  # job's count the same)
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
    ok &= len(run) == want and (j["count"] == want or not j["autoscale"]) and all(
        ms[t["machine"]]["profile"]["applied"] == j["entitlement"] for t in run)
sys.exit(0 if ok else 1)
PY
    then return 0; fi
    sleep 1
  done
  echo "did not settle at web $1, batch $2 running" >&2; return 1
}

finish() {  # $1: whether to leave the region running (1); else both jobs stopped
  if [ "$1" = 1 ]; then
    echo; echo "region left running: export TWINE_URL=$url TWINE_CA=$work/pki/ca.pem TWINE_TOKEN_FILE=$work/api-token"
    echo "the fleet page: $url/ui/#/job/web/api ; stop it with: $py -m controlplane.devregion down --dir $work"
    return
  fi
  ctl job stop web/api --wait 60
  ctl job stop batch/work --wait 60
  echo; echo "demo done (logs in $work/logs)"
}
