#!/usr/bin/env bash
# Host packages for the VM region (Vagrant + libvirt + the box builder), from Debian only.
# Idempotent: installs only what is missing; `apt-get update` runs only then.
# Nothing is started here: on hosts without systemd as PID 1, vagrant/vmenv.sh runs libvirtd.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "setup-vm: run as root" >&2; exit 1; }

packages=(
  vagrant vagrant-libvirt
  libvirt-daemon-system libvirt-clients
  qemu-system-x86 qemu-utils
  mmdebstrap dnsmasq-base tini
  # the box builder (mke2fs -d, sfdisk) and vmenv.sh (unshare, nsenter, ip); ssh/rsync to guests
  e2fsprogs fdisk util-linux iproute2 openssh-client rsync ca-certificates
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup-vm: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Recommends would pull in desktop bits (virt-viewer, ovmf, ...) the region does not use.
if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "setup-vm: apt-get failed (full log above); missing were: ${missing[*]}" >&2
  exit 1
fi
echo "setup-vm: installed"
