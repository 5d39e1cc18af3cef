#!/usr/bin/env bash
# Install (or upgrade) etcd and twine-controld as systemd services on this host, or uninstall them.
#
#   install-controld.sh [--listen HOST:PORT] [--region R] [--heartbeat-timeout S]
#                       [--api-token-file F] [--bootstrap-token-file F] [--wheelhouse DIR]
#                       [--etcd-data-dir DIR] [--tls-cert F --tls-key F [--tls-ca F]]
#   install-controld.sh --uninstall [--purge]
#
# etcd (Debian's etcd-server) listens on 127.0.0.1:2379 only, configured in /etc/default/etcd
# with room for one job's transaction, over TLS with client certificates and its auth on: only
# controld's certificate reaches the region's keys (its CA and the admin's certificate, root, in
# /etc/twine/etcd-pki; the CA lasts ten years, its certificates one: a re-run in their last 30
# days issues them again). twine-controld runs as the system user `twine` from
# /etc/twine/controld.toml (see systemd/controld.toml.example). Tokens: the files given, or new
# random ones the first time; /etc/twine/api-tokens and /etc/twine/bootstrap-tokens, mode 0600
# (bootstrap tokens expire a day after they are written: an older file is renewed). The key that
# seals secret task values in etcd: /etc/twine/secret-keys, made the first time and kept.
# --tls-cert/--tls-key: the API is served over https with this certificate (installed in
# /etc/twine/tls, the key mode 0600); --tls-ca: the CA that replicas verify each other against.
# Re-running it upgrades the code and restarts controld (etcd keeps its data).
# --uninstall stops and removes controld (etcd and its data stay); --purge also removes
# /etc/twine/controld.toml and the token files (the sealing key stays, as etcd's data does: the
# secret values held there are sealed with it).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
. "$src/scripts/install-lib.sh"

listen=0.0.0.0:7080 region=region1 heartbeat_timeout=5 api_file="" boot_file="" wheelhouse=""
etcd_data=/var/lib/etcd/twine uninstall=0 purge=0 tls_cert="" tls_key="" tls_ca=""
max_txn_ops=65536  # etcd's limit and controld's batch size: a job in one transaction
while [ $# -gt 0 ]; do
  case $1 in
    --listen) listen=${2:?}; shift 2;;
    --region) region=${2:?}; shift 2;;
    --heartbeat-timeout) heartbeat_timeout=${2:?}; shift 2;;
    --api-token-file) api_file=${2:?}; shift 2;;
    --bootstrap-token-file) boot_file=${2:?}; shift 2;;
    --wheelhouse) wheelhouse=$(cd "${2:?}" 2>/dev/null && pwd) || usage_error "--wheelhouse $2: no such directory"; shift 2;;
    --etcd-data-dir) etcd_data=${2:?}; shift 2;;
    --tls-cert) tls_cert=${2:?}; shift 2;;
    --tls-key) tls_key=${2:?}; shift 2;;
    --tls-ca) tls_ca=${2:?}; shift 2;;
    --uninstall) uninstall=1; shift;;
    --purge) purge=1; shift;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) usage_error "unknown argument: $1";;
  esac
done
[ "$(id -u)" = 0 ] || die "run as root"

if [ $uninstall = 1 ]; then
  have_systemd && systemctl disable --now twine-controld.service 2>/dev/null || true
  rm -f /etc/systemd/system/twine-controld.service
  have_systemd && systemctl daemon-reload
  [ $purge = 0 ] || rm -f /etc/twine/controld.toml /etc/twine/api-tokens /etc/twine/bootstrap-tokens
  echo "install-controld: twine-controld removed; etcd and its data are left as they were"
  exit 0
fi

case $listen in *:[0-9]*) ;; *) usage_error "--listen $listen: must be HOST:PORT";; esac
if [ -n "$tls_cert$tls_key" ] && { [ -z "$tls_cert" ] || [ -z "$tls_key" ]; }; then
  usage_error "--tls-cert and --tls-key go together"
fi
for f in "$tls_cert" "$tls_key" "$tls_ca"; do [ -z "$f" ] || [ -r "$f" ] || die "$f: cannot read it"; done
command -v etcd >/dev/null || die "etcd is missing: apt-get install etcd-server"
install_code "$src" "$wheelhouse"
getent passwd twine >/dev/null || useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin twine

# etcd: loopback only, TLS, and only clients with a certificate of its own CA; with its auth on,
# controld's (common name twine-controld) is the one that reaches the region's keys. The CA and
# etcd's admin's certificate (root) stay in /etc/twine/etcd-pki, root's alone; a re-run keeps them.
py=/opt/twine/venv/bin/python
etcd_pki=/etc/twine/etcd-pki etcd_tls=/etc/twine/etcd-tls
etcd_group=$(id -gn etcd 2>/dev/null || echo root)
install -d -m 0700 "$etcd_pki"
"$py" -m controlplane.security.pki "$etcd_pki" --server etcd --ip 127.0.0.1 --client twine-controld --client root \
  || die "could not make etcd's certificates in $etcd_pki"
install -d -m 0750 -o root -g "$etcd_group" "$etcd_tls"
install -m 0644 "$etcd_pki/ca.pem" "$etcd_tls/ca.pem"
install -m 0644 "$etcd_pki/etcd.pem" "$etcd_tls/etcd.pem"
install -m 0640 -o root -g "$etcd_group" "$etcd_pki/etcd-key.pem" "$etcd_tls/etcd-key.pem"
install -d -m 0750 -o root -g twine /etc/twine/tls
install -m 0644 "$etcd_pki/ca.pem" /etc/twine/tls/etcd-ca.pem
install -m 0644 "$etcd_pki/twine-controld.pem" /etc/twine/tls/etcd-client.pem
install -m 0600 -o twine -g twine "$etcd_pki/twine-controld-key.pem" /etc/twine/tls/etcd-client-key.pem
# Debian's unit reads /etc/default/etcd.
cat > /etc/default/etcd.new <<ETCD
# Written by install-controld.sh.
ETCD_NAME=$(hostname -s)
ETCD_DATA_DIR=$etcd_data
ETCD_LISTEN_CLIENT_URLS=https://127.0.0.1:2379
ETCD_ADVERTISE_CLIENT_URLS=https://127.0.0.1:2379
ETCD_CERT_FILE=$etcd_tls/etcd.pem
ETCD_KEY_FILE=$etcd_tls/etcd-key.pem
ETCD_TRUSTED_CA_FILE=$etcd_tls/ca.pem
ETCD_CLIENT_CERT_AUTH=true
ETCD_LISTEN_PEER_URLS=http://127.0.0.1:2380
ETCD_INITIAL_ADVERTISE_PEER_URLS=http://127.0.0.1:2380
ETCD_INITIAL_CLUSTER=$(hostname -s)=http://127.0.0.1:2380
# Larger transactions than etcd's default 128 operations: a job in one (controld's max_txn_ops).
ETCD_MAX_TXN_OPS=$max_txn_ops
ETCD_MAX_REQUEST_BYTES=33554432
ETCD
mv /etc/default/etcd.new /etc/default/etcd
mkdir -p "$etcd_data"
chown etcd:etcd "$etcd_data" 2>/dev/null || true
chmod 0700 "$etcd_data"

# Tokens: the files given, else keep what is there, else new random ones. Bootstrap tokens expire
# a day after their file is written (controld's --bootstrap-token-ttl): an older file is renewed.
for pair in "api-tokens:$api_file" "bootstrap-tokens:$boot_file"; do
  name=${pair%%:*} given=${pair#*:}
  if [ -n "$given" ]; then
    put_secret "$given" "/etc/twine/$name" twine
  elif [ ! -s "/etc/twine/$name" ] || { [ "$name" = bootstrap-tokens ] && [ -n "$(find "/etc/twine/$name" -mmin +1440)" ]; }; then
    (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "/etc/twine/$name"; echo >> "/etc/twine/$name")
    chown twine:twine "/etc/twine/$name"
    echo "install-controld: made a new token in /etc/twine/$name"
  fi
  chmod 0600 "/etc/twine/$name"
done

# The key that seals secret task values in etcd (controld's --secret-key-file): kept when there.
if [ ! -s /etc/twine/secret-keys ]; then
  (umask 077; echo "key1:$(head -c 32 /dev/urandom | base64 -w0)" > /etc/twine/secret-keys)
  echo "install-controld: made a new key that seals secret task values, /etc/twine/secret-keys"
fi
chown twine:twine /etc/twine/secret-keys
chmod 0600 /etc/twine/secret-keys

tls_conf=""
if [ -n "$tls_cert" ]; then
  install -d -m 0750 -o root -g twine /etc/twine/tls
  install -m 0644 "$tls_cert" /etc/twine/tls/controld.pem
  install -m 0600 -o twine -g twine "$tls_key" /etc/twine/tls/controld-key.pem
  [ -z "$tls_ca" ] || install -m 0644 "$tls_ca" /etc/twine/tls/ca.pem
fi
# TLS installed now or by an earlier run: a re-run without the flags keeps it (agents use https)
if [ -e /etc/twine/tls/controld.pem ] && [ -e /etc/twine/tls/controld-key.pem ]; then
  tls_conf=$'tls_cert = "/etc/twine/tls/controld.pem"\ntls_key = "/etc/twine/tls/controld-key.pem"'
  [ ! -e /etc/twine/tls/ca.pem ] || tls_conf+=$'\ntls_ca = "/etc/twine/tls/ca.pem"'
fi
cat > /etc/twine/controld.toml.new <<CONF
# Written by install-controld.sh; see /opt/twine/README.md and twine-controld --help.
etcd = "127.0.0.1:2379"
etcd_ca = "/etc/twine/tls/etcd-ca.pem"
etcd_cert = "/etc/twine/tls/etcd-client.pem"
etcd_key = "/etc/twine/tls/etcd-client-key.pem"
region = "$region"
listen = "$listen"
api_token_file = "/etc/twine/api-tokens"
bootstrap_token_file = "/etc/twine/bootstrap-tokens"
secret_key_file = "/etc/twine/secret-keys"
heartbeat_timeout = $heartbeat_timeout
max_txn_ops = $max_txn_ops
profiles = ["/etc/twine/profiles", "/opt/twine/profiles"]
$tls_conf
CONF
install -m 0640 -o root -g twine /etc/twine/controld.toml.new /etc/twine/controld.toml
rm -f /etc/twine/controld.toml.new

if have_systemd; then
  systemctl enable etcd.service >/dev/null 2>&1
  systemctl restart etcd.service || { journalctl -u etcd -n 30 --no-pager >&2; die "etcd did not start"; }
fi
etcd_auth=("$py" -m controlplane.security.etcdauth --endpoint 127.0.0.1:2379 --ca "$etcd_pki/ca.pem"
           --cert "$etcd_pki/root.pem" --key "$etcd_pki/root-key.pem" --user twine-controld)
if have_systemd; then
  for try in 1 2 3 4 5 6 7 8 9 10; do  # etcd may take a moment to take clients after its restart
    rc=0; out=$("${etcd_auth[@]}" 2>&1) || rc=$?
    [ $rc = 0 ] && break
    { [ $rc = 2 ] || [ $try = 10 ]; } && { echo "$out" >&2; die "could not turn etcd's auth on"; }  # 2: bad input
    sleep 2
  done
  echo "$out" | sed 's/^etcdauth: /install-controld: etcd: /'
else
  echo "install-controld: etcd not started here; once it runs, turn its auth on: ${etcd_auth[*]}"
fi
install_unit twine-controld "$src"
