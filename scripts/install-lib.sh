# Shared by install-agent.sh and install-controld.sh (sourced, not run): the code and its
# virtualenv under /opt/twine, from a wheelhouse (offline hosts) or from this source tree.

die() { echo "${0##*/}: $*" >&2; exit 1; }
usage_error() { echo "${0##*/}: $*" >&2; echo "see: ${0##*/} --help" >&2; exit 2; }
have_systemd() { [ "$(ps -o comm= -p 1)" = systemd ]; }

# install_code SRC WHEELHOUSE: /opt/twine/venv with twine installed (upgraded when re-run),
# the shipped profiles in /opt/twine/profiles and the README beside them. Run from /opt/twine/scripts
# without a wheelhouse (to change a flag, or to make a host that runs the agent a control host),
# the code installed is kept.
install_code() {
  local src=$1 wheelhouse=$2 log
  command -v python3 >/dev/null || die "python3 is missing: apt-get install python3 python3-venv"
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "python3 is $(python3 -V 2>&1); twine needs 3.11 or newer"
  mkdir -p /opt/twine
  if [ ! -x /opt/twine/venv/bin/python ]; then
    python3 -m venv /opt/twine/venv || die "python3 -m venv failed: apt-get install python3-venv"
  fi
  log=$(mktemp)
  if [ -n "$wheelhouse" ]; then
    [ -d "$wheelhouse" ] || die "--wheelhouse $wheelhouse: no such directory (make one with scripts/build-wheelhouse.sh)"
    ls "$wheelhouse"/twine-*.whl >/dev/null 2>&1 || die "--wheelhouse $wheelhouse: holds no twine wheel (make one with scripts/build-wheelhouse.sh)"
    # the wheelhouse installed last (both installers on one host, a re-run to change a flag): kept
    local stamp
    stamp=$(cat "$wheelhouse"/*.whl | sha256sum | cut -c1-16)
    if [ "$(cat /opt/twine/.wheelhouse 2>/dev/null)" != "$stamp" ]; then
      rm -f /opt/twine/.wheelhouse
      /opt/twine/venv/bin/pip install -q --no-index --find-links "$wheelhouse" --upgrade --force-reinstall --no-deps twine >"$log" 2>&1 \
        && /opt/twine/venv/bin/pip install -q --no-index --find-links "$wheelhouse" twine >>"$log" 2>&1 \
        || { cat "$log" >&2; rm -f "$log"; die "pip install from $wheelhouse failed"; }
      echo "$stamp" > /opt/twine/.wheelhouse
    fi
  elif [ ! -e "$src/pyproject.toml" ] && [ "$src" -ef /opt/twine ]; then
    # run from the installed copy (/opt/twine/scripts) without a wheelhouse: no source to install
    # from, so the code installed (by either installer) is kept as it is
    /opt/twine/venv/bin/python -c 'import controlplane, agent' 2>/dev/null \
      || die "no twine installed in /opt/twine/venv to keep: give --wheelhouse DIR (scripts/build-wheelhouse.sh)"
  else
    rm -f /opt/twine/.wheelhouse
    /opt/twine/venv/bin/pip install -q --upgrade --force-reinstall --no-deps "$src" >"$log" 2>&1 \
      && /opt/twine/venv/bin/pip install -q "$src" >>"$log" 2>&1 \
      || { cat "$log" >&2; rm -f "$log"; die "pip install failed (no internet? use --wheelhouse DIR)"; }
  fi
  rm -f "$log"
  # the fleet page's charting library (uPlot): the wheelhouse's copy, or the checkout's (scripts/setup.sh)
  local d
  for d in "${wheelhouse:+$wheelhouse/ui-assets}" "$src/ui/node_modules/uplot/dist"; do
    if [ -n "$d" ] && [ -f "$d/uPlot.iife.min.js" ]; then
      install -d /usr/share/twine/ui/uplot
      install -m 0644 "$d/uPlot.iife.min.js" "$d/uPlot.min.css" /usr/share/twine/ui/uplot/
      break
    fi
  done
  # the profiles, and the installers with what they read (units, README): a host runs them again
  # from /opt/twine/scripts later (an upgrade, --etcd-add-member on a control host) without the
  # source tree it was installed from (a guest's /tmp is emptied at boot)
  local part
  for part in profiles scripts systemd; do
    rm -rf "/opt/twine/$part.new"
    cp -r "$src/$part" "/opt/twine/$part.new"
    rm -rf "/opt/twine/$part"
    mv "/opt/twine/$part.new" "/opt/twine/$part"
  done
  [ "$src/README.md" -ef /opt/twine/README.md ] || install -m 0644 "$src/README.md" /opt/twine/README.md
  mkdir -p /etc/twine/profiles
}

# install_unit NAME SRC [no-start]: the unit file, then daemon-reload; enable it and start or restart
# it (an upgrade); with no-start, enabled (it starts at the next boot) and not started now unless
# it runs already (then restarted: an upgrade).
install_unit() {
  local name=$1 src=$2 start=${3:-start}
  install -m 0644 "$src/systemd/$name.service" "/etc/systemd/system/$name.service"
  if ! have_systemd; then
    echo "${0##*/}: systemd is not PID 1 here: $name.service installed, not started"
    return 0
  fi
  systemctl daemon-reload
  systemctl enable "$name.service" >/dev/null 2>&1
  if [ "$start" = no-start ] && ! systemctl -q is-active "$name.service"; then
    echo "${0##*/}: $name.service installed and enabled, not started (systemctl start $name)"
    return 0
  fi  # (one running is restarted on the new code all the same)
  systemctl restart "$name.service" || {
    journalctl -u "$name.service" -n 30 --no-pager >&2 || true
    die "$name.service did not start (journalctl -u $name.service)"
  }
  echo "${0##*/}: $name.service $(systemctl is-active "$name.service")"
}

# put_secret SRC DEST OWNER: a token file, mode 0600, never world- or group-readable.
put_secret() {
  local src=$1 dest=$2 owner=$3
  [ -r "$src" ] || die "$src: cannot read it"
  [ -n "$(head -n1 "$src" | tr -d '[:space:]')" ] || die "$src: the first line (the token) is empty"
  install -m 0600 -o "$owner" -g "$(id -gn "$owner")" "$src" "$dest.new"
  mv "$dest.new" "$dest"
}
