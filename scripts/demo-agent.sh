#!/usr/bin/env bash
# The single-agent demo (no control plane): set up, then run the agent on this host: it applies the `web` host profile for real and runs two
# task containers from examples/desired.toml; shows the result; then hands the host back (tasks
# removed, profile rolled back). `--keep` leaves the agent and its tasks running.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
keep=0; [ "${1:-}" = --keep ] && keep=1

work=$(mktemp -d /tmp/twine-demo.XXXXXX)
listen=127.0.0.1:${TWINE_DEMO_PORT:-17070}
machine=demo-$(cat /etc/machine-id 2>/dev/null || hostname)
agent=(.venv/bin/twine-agent --state-dir "$work/state")
cp examples/desired.toml "$work/desired.toml"

wait_for() {  # wait_for DESCRIPTION PYTHON-EXPRESSION-OVER-s
  .venv/bin/python - "$listen" "$1" "$2" <<'PY'
import sys, time
from agent.status_cli import fetch_status
listen, what, expr = sys.argv[1:]
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        s = fetch_status(listen)
        if eval(expr):
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.2)
sys.exit(f"demo: timed out waiting for {what}")
PY
}

echo; echo "== what the web profile would change on this host (dry run)"
"${agent[@]}" profile diff web

echo; echo "== starting twine-agent (machine $machine, state in $work)"
"${agent[@]}" run --desired "$work/desired.toml" --listen "$listen" --machine-id "$machine" \
  --image-pull never >"$work/agent.log" 2>&1 &
pid=$!
trap '[ $keep = 1 ] || kill $pid 2>/dev/null || true' EXIT
wait_for "tasks running" 'all(t["state"] == "running" for t in s["tasks"]) and s["profile"]["ready"] and s["health"]'

echo; echo "== twine-agent status"
"${agent[@]}" status --listen "$listen"
echo; echo "== the profile as applied (twine-agent profile verify)"
"${agent[@]}" profile verify || true
echo; echo "== the task containers in Docker"
docker ps --filter "label=twine.machine=$machine" --format 'table {{.ID}}\t{{.Names}}\t{{.Status}}'
sleep 2
first=$(docker ps -q --filter "label=twine.machine=$machine" | head -n1)
echo; echo "== last log lines of $first"; docker logs --tail 2 "$first"

if [ $keep = 1 ]; then
  echo; echo "agent left running (pid $pid, status: ${agent[*]} status --listen $listen)"
  exit 0
fi

echo; echo "== handing the host back: empty desired state (no tasks, no profile)"
printf 'tasks = []\n' > "$work/desired.toml.new" && mv "$work/desired.toml.new" "$work/desired.toml"
wait_for "tasks removed and profile rolled back" 'not s["tasks"] and not s["stopping"] and s["profile"]["applied"] is None'
"${agent[@]}" status --listen "$listen"
kill -TERM $pid; wait $pid || true
left=$(docker ps -aq --filter "label=twine.machine=$machine" | wc -l)
echo; echo "demo done: agent stopped, $left container(s) left, profile rolled back (log: $work/agent.log)"
