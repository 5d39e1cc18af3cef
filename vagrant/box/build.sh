#!/usr/bin/env bash
# Builds the Vagrant box twine/debian12 (libvirt provider) from Debian 12 packages, as root.
#   mmdebstrap -> mke2fs -d -> sparse partitioned disk -> one boot under qemu (-kernel) that
#   runs grub-install/update-grub inside -> qemu-img convert -c -> box tar -> vagrant box add.
# No loop devices and no mounts, so it works in containers and on hosts without udev.
# The box also holds twine's Python dependencies, preinstalled in /opt/twine/venv from the
# region's wheelhouse (scripts/build-wheelhouse.sh, the one `vagrant up` stages): the installers
# then add only twine itself, instead of making a virtualenv and installing two dozen wheels in
# every guest under emulation (about a minute each). Without it the installers do it all.
# Cached by a hash of its inputs (this script, which holds the package list and every guest
# file, Vagrant's insecure public key and the names of the dependency wheels): an unchanged box
# is neither rebuilt nor re-added.
#   TWINE_BOX_CACHE    where boxes are kept (default /var/cache/twine/boxes)
#   TWINE_DEBIAN_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   TWINE_BOX_DEPS=0   no preinstalled dependencies (and no wheelhouse built)
#   FORCE=1            rebuild even when the box for this hash exists
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "box: run as root (mmdebstrap --mode=root)" >&2; exit 1; }
self=$(readlink -f "$0")
repo=$(cd "$(dirname "$self")/../.." && pwd)

box_name=twine/debian12
cache=${TWINE_BOX_CACHE:-/var/cache/twine/boxes}
mirror=${TWINE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${TWINE_DEBIAN_SECURITY_MIRROR:-${mirror%/debian}/debian-security}
disk_gib=4
guest_hostname=twine-debian12

packages=(
  linux-image-amd64 initramfs-tools grub-pc
  systemd systemd-sysv udev dbus libpam-systemd kmod
  openssh-server sudo
  ifupdown isc-dhcp-client iproute2 iputils-ping netbase netcat-openbsd curl ca-certificates
  python3 python3-venv python3-pip
  docker.io etcd-server etcd-client busybox-static
  irqbalance procps rsync e2fsprogs less xz-utils
  apparmor
)

die() { echo "box: $*" >&2; exit 1; }
for tool in mmdebstrap mke2fs sfdisk qemu-system-x86_64 qemu-img vagrant; do
  command -v "$tool" >/dev/null || die "$tool missing (run scripts/setup-vm.sh)"
done

# Vagrant's well-known insecure key pair ships inside the vagrant package; the guest trusts it.
pubkey=$(find /usr/share/rubygems-integration /usr/lib/ruby/vendor_ruby /opt/vagrant \
           -path '*vagrant*/keys/vagrant.pub' 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$pubkey" ] || die "Vagrant's insecure key (keys/vagrant.pub) not found; is the vagrant package installed?"

# The dependency wheels (every wheel of the wheelhouse but twine's own): the same directory the
# Vagrantfile stages, so `vagrant up` finds it built.
wheelhouse=$repo/vagrant/.region/wheelhouse
deps=()
if [ "${TWINE_BOX_DEPS:-1}" != 0 ]; then
  python=python3
  [ -x "$repo/.venv/bin/python" ] && python=$repo/.venv/bin/python
  PYTHON=$python bash "$repo/scripts/build-wheelhouse.sh" "$wheelhouse" >/dev/null \
    || die "building the wheelhouse failed (pip needs PyPI; or TWINE_BOX_DEPS=0 for a box without dependencies)"
  for w in "$wheelhouse"/*.whl; do
    case ${w##*/} in twine-*) ;; *) deps+=("${w##*/}");; esac
  done
fi

hash=$( (cat "$self" "$pubkey"; printf '%s\n' "${deps[@]}") | sha256sum | cut -c1-16)
box=$cache/twine-debian12-$hash.box
vagrant_home=${VAGRANT_HOME:-$HOME/.vagrant.d}
marker=$vagrant_home/twine-debian12.hash

add_box() {
  # grep without -q: an early exit would make `vagrant box list` fail on SIGPIPE.
  if [ "$(cat "$marker" 2>/dev/null)" = "$hash" ] && vagrant box list 2>/dev/null | grep "^$box_name " >/dev/null; then
    return
  fi
  echo "box: vagrant box add $box_name ($hash)"
  vagrant box add --force --name "$box_name" "$box" >/dev/null
  mkdir -p "$vagrant_home"
  echo "$hash" > "$marker"
}

if [ "${FORCE:-0}" != 1 ] && [ -s "$box" ]; then
  add_box
  echo "$box"
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.build-$hash.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
log=$work/build.log
start=$SECONDS
step() { echo "box: [$((SECONDS - start))s] $*"; }
run_logged() {
  "$@" >>"$log" 2>&1 || { tail -n 40 "$log" >&2; die "failed: $*"; }
}

# mmdebstrap itself puts a policy-rc.d (exit 101) and a dummy start-stop-daemon in place while
# packages install, so neither docker nor etcd nor sshd start on the build host.
step "mmdebstrap bookworm (${#packages[@]} packages)"
include=$(IFS=,; echo "${packages[*]}")
run_logged mmdebstrap --mode=root --variant=apt --include="$include" \
  --aptopt='Acquire::Check-Valid-Until "false"' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  bookworm "$root" \
  "deb $mirror bookworm main" \
  "deb $mirror bookworm-updates main" \
  "deb $security_mirror bookworm-security main"
[ ! -e "$root/usr/sbin/policy-rc.d" ] || die "policy-rc.d left in the image"

step "configure the guest"
echo "$guest_hostname" > "$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' \
  "$guest_hostname" > "$root/etc/hosts"
echo 'LABEL=root / ext4 defaults,errors=remount-ro 0 1' > "$root/etc/fstab"
rm -f "$root/etc/resolv.conf"   # the build host's; dhclient writes the guest's own

# Vagrant's debian guest plugin appends its private networks to /etc/network/interfaces.
printf 'source /etc/network/interfaces.d/*\n\nauto lo\niface lo inet loopback\n' \
  > "$root/etc/network/interfaces"
printf 'auto eth0\niface eth0 inet dhcp\n' > "$root/etc/network/interfaces.d/eth0"

# Empty machine-id: systemd makes a new one at each VM's first boot (and commits it).
: > "$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
ln -s /etc/machine-id "$root/var/lib/dbus/machine-id"

# Host keys are made at first boot, so no two VMs share them. Not `ssh-keygen -A`: its RSA
# key took 46 s of emulated CPU (TCG), and Vagrant waits for sshd; ed25519/ECDSA take < 1 s.
rm -f "$root"/etc/ssh/ssh_host_*
printf 'HostKey /etc/ssh/ssh_host_ed25519_key\nHostKey /etc/ssh/ssh_host_ecdsa_key\n' \
  > "$root/etc/ssh/sshd_config.d/host-keys.conf"
cat > "$root/etc/systemd/system/ssh-host-keys.service" <<'EOF'
[Unit]
Description=Generate SSH host keys on first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key
ExecStart=/usr/bin/ssh-keygen -q -t ecdsa -N "" -f /etc/ssh/ssh_host_ecdsa_key

[Install]
WantedBy=ssh.service
EOF

chroot "$root" useradd --create-home --shell /bin/bash --user-group --groups sudo,docker vagrant
chroot "$root" usermod --password '*' vagrant   # no password, yet not "locked" for sshd
install -d -m 0700 "$root/home/vagrant/.ssh"
install -m 0600 "$pubkey" "$root/home/vagrant/.ssh/authorized_keys"
chroot "$root" chown -R vagrant:vagrant /home/vagrant/.ssh
echo 'vagrant ALL=(ALL) NOPASSWD:ALL' > "$root/etc/sudoers.d/vagrant"
chmod 0440 "$root/etc/sudoers.d/vagrant"

sed -i -e 's/^GRUB_TIMEOUT=.*/GRUB_TIMEOUT=0/' \
  -e 's/^GRUB_CMDLINE_LINUX=.*/GRUB_CMDLINE_LINUX="console=tty0 console=ttyS0,115200 net.ifnames=0 biosdevname=0 systemd.unified_cgroup_hierarchy=1"/' \
  "$root/etc/default/grub"
printf 'GRUB_TERMINAL="console serial"\nGRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"\n' \
  >> "$root/etc/default/grub"

if [ ${#deps[@]} -gt 0 ]; then
  step "preinstall ${#deps[@]} dependency wheels in /opt/twine/venv"
  mkdir -p "$root/tmp/wheelhouse"
  for w in "${deps[@]}"; do cp "$wheelhouse/$w" "$root/tmp/wheelhouse/"; done
  run_logged chroot "$root" python3 -m venv /opt/twine/venv
  run_logged chroot "$root" sh -c 'cd /tmp/wheelhouse && /opt/twine/venv/bin/pip install -q --no-index --find-links . ./*.whl'
  rm -rf "$root/tmp/wheelhouse" "$root/root/.cache/pip"
fi

# etcd is configured and enabled by the control VM's installer, Docker by the machines' (the
# control VM runs no tasks: Docker would only cost it boot time under emulation).
# The guests reach no package registry, so apt's timers would only burn emulated CPU.
systemctl --root="$root" --quiet disable etcd.service docker.service containerd.service docker.socket
systemctl --root="$root" --quiet enable irqbalance.service ssh.service ssh-host-keys.service
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer; do
  systemctl --root="$root" --quiet disable "$unit" 2>/dev/null || true
done

# Runs as init= in the one boot below: GRUB can only be installed against the real disk.
cat > "$root/usr/local/sbin/twine-box-finalize" <<'EOF'
#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sys /sys
mountpoint -q /dev || mount -t devtmpfs dev /dev
if grub-install /dev/vda && update-grub; then result=OK; else result=FAILED; fi
rm -f /usr/local/sbin/twine-box-finalize
sync
mount -o remount,ro /
echo "TWINE-FINALIZE-$result"
echo o > /proc/sysrq-trigger
sleep 60
EOF
chmod 0755 "$root/usr/local/sbin/twine-box-finalize"
kernel=$(find "$root/boot" -name 'vmlinuz-*' | sort -V | tail -n 1)
initrd=$(find "$root/boot" -name 'initrd.img-*' | sort -V | tail -n 1)
cp "$kernel" "$work/vmlinuz"
cp "$initrd" "$work/initrd.img"

step "make the disk (${disk_gib} GiB sparse, ext4 from the rootfs)"
disk=$work/disk.raw
truncate -s "${disk_gib}G" "$disk"
echo 'label: dos
start=2048, type=83, bootable' | run_logged sfdisk -q "$disk"
# The filesystem is written straight into the partition, 1 MiB into the disk.
part_kib=$(( disk_gib * 1024 * 1024 - 1024 ))
run_logged mke2fs -q -F -t ext4 -L root -d "$root" -E offset=1048576 "$disk" "${part_kib}k"
rm -rf "$root"

step "boot once to install GRUB"
# TCG only is assumed (it works everywhere); SeaBIOS needs SMM off under TCG.
timeout 900 qemu-system-x86_64 -machine q35,smm=off -accel tcg -cpu qemu64 -m 1024 -smp 1 \
  -display none -monitor none -serial "file:$work/finalize.log" -nic none -no-reboot \
  -kernel "$work/vmlinuz" -initrd "$work/initrd.img" \
  -append "root=/dev/vda1 rw console=ttyS0 panic=-1 init=/usr/local/sbin/twine-box-finalize" \
  -drive "file=$disk,format=raw,if=virtio" >>"$log" 2>&1 || true
if ! grep -q TWINE-FINALIZE-OK "$work/finalize.log"; then
  tail -n 40 "$work/finalize.log" >&2
  die "installing GRUB in the image failed (serial log above)"
fi

step "compress to qcow2"
run_logged qemu-img convert -c -O qcow2 "$disk" "$work/box.img"
rm -f "$disk"
printf '{"provider":"libvirt","format":"qcow2","virtual_size":%d}\n' "$disk_gib" > "$work/metadata.json"
cat > "$work/Vagrantfile" <<'EOF'
# Defaults of the twine/debian12 box; a project's Vagrantfile overrides them.
Vagrant.configure("2") do |config|
  config.vm.synced_folder ".", "/vagrant", disabled: true
  # Every VM keeps Vagrant's insecure key: these are throwaway test machines on a private network.
  config.ssh.insert_key = false
  config.ssh.private_key_path = File.join(Vagrant.source_root.to_s, "keys", "vagrant")
  config.vm.provider :libvirt do |lv|
    lv.disk_bus = "virtio"
    lv.nic_model_type = "virtio"
    # Serial console only (virsh console): no VGA or VNC server to emulate per VM.
    lv.graphics_type = "none"
    lv.video_type = "none"
  end
end
EOF
tar -C "$work" -cf "$work/box.tar" metadata.json Vagrantfile box.img
mv "$work/box.tar" "$box"
find "$cache" -maxdepth 1 -name 'twine-debian12-*.box' ! -name "${box##*/}" -delete
step "built $(du -h "$box" | cut -f1) box"

add_box
echo "$box"
