#!/usr/bin/env bash
# Runs vagrant/virsh against a libvirtd of our own where systemd is not PID 1 (containers, CI):
# a private mount + net + pid namespace, with tini as its init, holding libvirtd, virtlogd, the
# VMs and their networks. Nothing of it touches the host's /etc, /run or network.
#   vmenv.sh up | down | status | exec CMD [ARGS...]
# Where the host runs libvirtd under systemd, exec runs CMD directly and up/down do nothing.
# Scratch state lives in $TWINE_VMENV_DIR (default /var/lib/twine-vmenv) and is wiped by down.
set -euo pipefail
self=$(readlink -f "$0")
dir=${TWINE_VMENV_DIR:-/var/lib/twine-vmenv}
pidfile=$dir/init.pid
# host path -> scratch folder bound over it inside the namespace
binds=(/etc/libvirt:etc /var/lib/libvirt:lib /var/log/libvirt:log /var/cache/libvirt:cache)

die() { echo "vmenv: $*" >&2; exit 1; }

host_libvirt() {
  [ "$(ps -o comm= -p 1 2>/dev/null)" = systemd ] && virsh -c qemu:///system version >/dev/null 2>&1
}

# The PID (on the host) of the namespace's tini, if it is alive and really ours.
init_pid() {
  local pid
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = tini ] || return 1
  [ "$(readlink "/proc/$pid/ns/pid")" != "$(readlink /proc/self/ns/pid)" ] || return 1
  echo "$pid"
}

in_ns() {
  local pid
  pid=$(init_pid) || die "not up (run: $0 up)"
  exec nsenter -t "$pid" -m -n -p --wd="$PWD" -- "$@"
}

# PID 2 of the namespace, under tini: mounts, daemons, then sleeps until tini is told to stop.
ns_init() {
  # The host's /run stays reachable (the docker socket) while libvirt gets a /run of its own.
  mkdir -p "$dir/host-run"
  mount --rbind /run "$dir/host-run"
  mount -t tmpfs -o mode=0755 tmpfs /run
  ln -s "$dir/host-run/docker.sock" /run/docker.sock
  # A sysfs of this network namespace (libvirt reads /sys/class/net), and no cgroup mounts:
  # libvirt would try to place qemu in cgroups it may not manage here.
  umount -l /sys
  mount -t sysfs sysfs /sys
  local b
  for b in "${binds[@]}"; do
    mkdir -p "${b%%:*}"
    mount --bind "$dir/${b##*:}" "${b%%:*}"
  done
  ip link set lo up
  virtlogd -d
  libvirtd -d
  local _
  for _ in $(seq 1 60); do
    virsh -c qemu:///system version >/dev/null 2>&1 && break
    sleep 0.5
  done
  virsh -c qemu:///system version >/dev/null || { echo "vmenv: libvirtd did not answer" >&2; exit 1; }
  touch "$dir/ready"
  exec sleep infinity
}

cleanup_scratch() {
  local b
  for b in "${binds[@]}"; do rm -rf "${dir:?}/${b##*:}"; done
  rmdir "$dir/host-run" 2>/dev/null || true   # empty on the host; the bind lived in the namespace
  rm -f "$dir/ready" "$pidfile" "$dir/init.log"
  rmdir "$dir" 2>/dev/null || true
}

up() {
  if host_libvirt; then echo "vmenv: using the host's libvirtd"; return; fi
  local pid
  if pid=$(init_pid); then echo "vmenv: already up (init pid $pid)"; return; fi
  [ "$(id -u)" = 0 ] || die "run as root"
  for tool in tini unshare nsenter libvirtd virtlogd virsh; do
    command -v "$tool" >/dev/null || die "$tool missing (run scripts/setup-vm.sh)"
  done
  cleanup_scratch
  mkdir -p "$dir"
  local b
  for b in "${binds[@]}"; do
    mkdir -p "$dir/${b##*:}"
    # Start from the packaged files so ownership and defaults match a normal install.
    [ -d "${b%%:*}" ] && cp -a "${b%%:*}/." "$dir/${b##*:}/"
  done
  cat >> "$dir/etc/qemu.conf" <<'EOF'

# vmenv: no cgroup controllers and no AppArmor/SELinux in a private namespace
cgroup_controllers = [ ]
security_driver = "none"
# As root, qemu can open /dev/kvm (root-only here), as libvirt's capability probe did; with
# the default user the two disagree and libvirt re-probes qemu on every define (5-9 s each).
user = "root"
group = "root"
EOF
  # libvirt's own NAT network is not used (vagrant-libvirt makes its own); skip its dnsmasq.
  rm -f "$dir/etc/qemu/networks/autostart/default.xml"

  setsid unshare --mount --net --pid --fork --mount-proc --propagation private \
    tini -- "$self" _init </dev/null >"$dir/init.log" 2>&1 &
  local unshare_pid=$!
  pid=
  for _ in $(seq 1 50); do
    pid=$(awk '{print $1}' "/proc/$unshare_pid/task/$unshare_pid/children" 2>/dev/null)
    [ -n "$pid" ] && break
    sleep 0.1
  done
  [ -n "$pid" ] || { cat "$dir/init.log" >&2; die "the namespace did not start"; }
  echo "$pid" > "$pidfile"
  for _ in $(seq 1 120); do
    [ -e "$dir/ready" ] && break
    [ -d "/proc/$pid" ] || break
    sleep 0.5
  done
  if [ ! -e "$dir/ready" ]; then
    cat "$dir/init.log" >&2
    down >/dev/null 2>&1 || true
    die "libvirtd did not come up in the namespace"
  fi
  echo "vmenv: up (init pid $pid)"
}

down() {
  if host_libvirt; then echo "vmenv: using the host's libvirtd; nothing to stop"; return; fi
  local pid
  if pid=$(init_pid); then
    local dom
    for dom in $(nsenter -t "$pid" -m -n -p virsh -c qemu:///system list --name 2>/dev/null); do
      nsenter -t "$pid" -m -n -p virsh -c qemu:///system destroy "$dom" >/dev/null 2>&1 || true
    done
    # tini passes SIGTERM to its child; when that exits, the kernel kills the rest of the namespace.
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do [ -d "/proc/$pid" ] || break; sleep 0.2; done
    if [ -d "/proc/$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.5; fi
    echo "vmenv: down"
  else
    echo "vmenv: not up"
  fi
  cleanup_scratch
}

status() {
  if host_libvirt; then echo "vmenv: using the host's libvirtd"; return; fi
  local pid
  if pid=$(init_pid); then
    echo "vmenv: up (init pid $pid, scratch $dir)"
    nsenter -t "$pid" -m -n -p virsh -c qemu:///system list --all
    nsenter -t "$pid" -m -n -p virsh -c qemu:///system net-list --all
  else
    echo "vmenv: down"
    return 3
  fi
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up) up ;;
  down) down ;;
  status) status ;;
  exec)
    [ $# -gt 0 ] || die "usage: $0 exec CMD [ARGS...]"
    if host_libvirt; then exec "$@"; fi
    in_ns "$@"
    ;;
  _init) ns_init ;;
  *) die "usage: $0 up | down | status | exec CMD [ARGS...]" ;;
esac
