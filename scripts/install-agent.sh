#!/usr/bin/env bash
# Install twine-agent as a systemd service on this host:
#   /opt/twine (this checkout's code and a virtualenv), /etc/twine (config, profiles, desired
#   state), /etc/systemd/system/twine-agent.service. Idempotent; keeps an existing config.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "install-agent: run as root" >&2; exit 1; }
mkdir -p /opt/twine /etc/twine/profiles
if [ "$src" != /opt/twine ]; then
  tar -C "$src" --exclude=.venv --exclude=.git -c . | tar -C /opt/twine -x
fi
cd /opt/twine
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e .   # editable: profiles/ is found beside the code
[ -e /etc/twine/agent.toml ] || cp systemd/agent.toml.example /etc/twine/agent.toml
[ -e /etc/twine/desired.toml ] || printf 'profile = "default"\ntasks = []\n' > /etc/twine/desired.toml
install -m 0644 systemd/twine-agent.service /etc/systemd/system/twine-agent.service
if [ "$(ps -o comm= -p 1)" = systemd ]; then
  systemctl daemon-reload
  systemctl enable --now twine-agent.service
  systemctl --no-pager status twine-agent.service | head -n 5
else
  echo "install-agent: systemd is not PID 1 here; unit installed, start it with systemd on a real host"
fi
