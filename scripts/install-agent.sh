#!/usr/bin/env bash
# Install (or upgrade) twine-agent as a systemd service on this host, or uninstall it.
#
#   install-agent.sh --control-plane URL[,URL...] --bootstrap-token-file FILE [--dc DC] [--msb MSB]
#                    [--rack RACK] [--machine-type TYPE] [--region R] [--listen HOST:PORT]
#                    [--address HOST:PORT] [--wheelhouse DIR] [--control-plane-ca FILE] [--no-start]
#   install-agent.sh --uninstall [--purge]
#
# Installs /opt/twine (code in a virtualenv, shipped profiles), /etc/twine/agent.toml (written from
# the flags; kept as it is when re-run without them), /etc/twine/bootstrap-token (mode 0600) and
# twine-agent.service, then starts it. Re-running it upgrades the code and restarts the agent;
# tasks keep running through the restart (KillMode=process, adopted by label).
# --control-plane takes one twine-controld URL, or the URLs of a region's replicas separated by
# commas: the agent calls them in that order and moves to the next one when one fails.
# --control-plane-ca FILE: the CA an https control plane's certificate chains to (/etc/twine/ca.pem).
# --wheelhouse DIR installs offline, from wheels made by scripts/build-wheelhouse.sh.
# --no-start installs and enables the service without starting it: a spare host that joins the
# region (its free pool) when you run `systemctl start twine-agent`, or at its next boot.
# --uninstall stops and removes the service and /opt/twine; task containers keep running
# (docker ps); --purge also removes /etc/twine and the agent's state (its machine credential).
# Checks first: cgroup v2, Docker answering, a machine id; each failure says what to do.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
. "$src/scripts/install-lib.sh"

control_plane="" token_file="" wheelhouse="" uninstall=0 purge=0 ca_file=""
listen="" address="" region="" dc="" msb="" rack="" machine_type="" start=start
while [ $# -gt 0 ]; do
  case $1 in
    --control-plane) control_plane=${2:?}; shift 2;;
    --bootstrap-token-file) token_file=${2:?}; shift 2;;
    --control-plane-ca) ca_file=${2:?}; shift 2;;
    --wheelhouse) wheelhouse=$(cd "${2:?}" 2>/dev/null && pwd) || usage_error "--wheelhouse $2: no such directory"; shift 2;;
    --region) region=${2:?}; shift 2;;
    --dc) dc=${2:?}; shift 2;;
    --msb) msb=${2:?}; shift 2;;
    --rack) rack=${2:?}; shift 2;;
    --machine-type) machine_type=${2:?}; shift 2;;
    --listen) listen=${2:?}; shift 2;;
    --address) address=${2:?}; shift 2;;
    --uninstall) uninstall=1; shift;;
    --purge) purge=1; shift;;
    --no-start) start=no-start; shift;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) usage_error "unknown argument: $1";;
  esac
done
[ "$(id -u)" = 0 ] || die "run as root (the agent manages containers and kernel settings)"

if [ $uninstall = 1 ]; then
  if have_systemd; then
    systemctl disable --now twine-agent.service 2>/dev/null || true
  fi
  rm -f /etc/systemd/system/twine-agent.service
  have_systemd && systemctl daemon-reload
  rm -rf /opt/twine/venv /opt/twine/profiles /opt/twine/README.md
  rmdir /opt/twine 2>/dev/null || true
  if [ $purge = 1 ]; then
    rm -rf /etc/twine/agent.toml /etc/twine/bootstrap-token /etc/twine/desired.toml /var/lib/twine-agent
  fi
  n=$(docker ps -q --filter label=twine.machine 2>/dev/null | wc -l || echo 0)
  echo "install-agent: twine-agent removed; $n task container(s) left running (docker ps --filter label=twine.machine)"
  exit 0
fi

# -- checks before anything is written --
[ -f /sys/fs/cgroup/cgroup.controllers ] \
  || die "this host is not on cgroup v2 only (no /sys/fs/cgroup/cgroup.controllers): boot with systemd.unified_cgroup_hierarchy=1"
command -v docker >/dev/null || die "docker is missing: apt-get install docker.io"
docker info >/dev/null 2>&1 || die "Docker does not answer (docker info): systemctl enable --now docker"
[ -s /etc/machine-id ] || die "/etc/machine-id is empty or missing: systemd-machine-id-setup"
if [ -n "$control_plane" ]; then
  IFS=, read -ra control_plane_urls <<< "${control_plane// /}"
  [ ${#control_plane_urls[@]} -gt 0 ] || usage_error "--control-plane needs at least one URL"
  for url in "${control_plane_urls[@]}"; do
    case $url in
      http://?*|https://?*) ;;
      *) usage_error "--control-plane: '$url' must be an http:// or https:// URL (several: comma-separated)";;
    esac
  done
  [ -n "$token_file" ] || usage_error "--control-plane needs --bootstrap-token-file FILE"
  [ -r "$token_file" ] || die "--bootstrap-token-file $token_file: cannot read it"
  [ -z "$ca_file" ] || [ -r "$ca_file" ] || die "--control-plane-ca $ca_file: cannot read it"
fi

install_code "$src" "$wheelhouse"

config=/etc/twine/agent.toml
if [ -n "$control_plane$dc$msb$rack$machine_type$region$listen$address" ] || [ ! -e $config ]; then
  {
    echo "# Written by install-agent.sh; flags of a re-run replace it."
    echo 'state_dir = "/var/lib/twine-agent"'
    if [ -n "$control_plane" ]; then
      printf 'control_plane = [%s]\n' "$(printf '"%s", ' "${control_plane_urls[@]}" | sed 's/, $//')"
      echo 'bootstrap_token_file = "/etc/twine/bootstrap-token"'
      # the CA given now, or installed by an earlier run (a re-run without the flag keeps it)
      { [ -n "$ca_file" ] || [ -e /etc/twine/ca.pem ]; } && echo 'control_plane_ca = "/etc/twine/ca.pem"'
    else
      echo 'desired = "/etc/twine/desired.toml"'
    fi
    echo "listen = \"${listen:-127.0.0.1:7070}\""
    [ -z "$address" ] || echo "address = \"$address\""
    echo 'task_cgroup = "twine.slice"'
    echo 'profiles_path = ["/etc/twine/profiles", "/opt/twine/profiles"]'
    echo
    echo '[labels]'
    echo "region = \"${region:-region1}\""
    echo "dc = \"${dc:-dc1}\""
    echo "msb = \"${msb:-msb1}\""
    echo "rack = \"${rack:-rack1}\""
    echo "machine_type = \"${machine_type:-generic}\""
  } > $config.new
  mv $config.new $config
fi
[ -z "$token_file" ] || put_secret "$token_file" /etc/twine/bootstrap-token root
# (the installed one given again, as a re-run to change a flag may: kept as it is)
[ -z "$ca_file" ] || [ "$ca_file" -ef /etc/twine/ca.pem ] || install -m 0644 "$ca_file" /etc/twine/ca.pem
[ -e /etc/twine/desired.toml ] || printf 'tasks = []\n' > /etc/twine/desired.toml
# Bad config is exit 2 before anything starts: say so here rather than in a unit that will not run.
/opt/twine/venv/bin/twine-agent --config $config profile current >/dev/null \
  || die "$config is not valid (see the message above)"

install_unit twine-agent "$src" $start
