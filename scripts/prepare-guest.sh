#!/usr/bin/env bash
# Run in a guest before the installers: a box built by vagrant/box/build.sh has everything, so
# this does nothing there; a downloaded Debian 12 box (VirtualBox) gets the same packages with apt.
set -euo pipefail
packages=(docker.io etcd-server busybox-static python3-venv iproute2 irqbalance)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "prepare-guest: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
# etcd is configured and started by install-controld.sh on the control VM only.
systemctl disable --now etcd.service >/dev/null 2>&1 || true
if ! grep -q "systemd.unified_cgroup_hierarchy=1" /proc/cmdline && [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
  echo "prepare-guest: this guest is not on cgroup v2; boot it with systemd.unified_cgroup_hierarchy=1" >&2
  exit 1
fi
