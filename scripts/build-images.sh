#!/usr/bin/env bash
# Local test images, made with `docker import` (no registry is reachable):
#   twine/busybox:1  a root filesystem holding only Debian's busybox-static and its applet links.
# Idempotent: an image that exists is left alone (FORCE=1 rebuilds).
set -euo pipefail
image=twine/busybox:1
if [ "${FORCE:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
  exit 0
fi
busybox=/bin/busybox
[ -x "$busybox" ] || { echo "build-images: $busybox missing (apt-get install busybox-static)" >&2; exit 1; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,etc,tmp,proc,sys,dev}
cp "$busybox" "$root/bin/busybox"
for applet in $("$busybox" --list); do
  [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
done
echo 'root:x:0:0:root:/:/bin/sh' > "$root/etc/passwd"
echo 'root:x:0:' > "$root/etc/group"
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]' \
  --message "busybox-static from Debian, for twine tests" - "$image" >/dev/null
echo "built $image"
