#!/usr/bin/env bash
# Install (or upgrade) etcd and twine-controld as systemd services on this host, or uninstall them.
#
#   install-controld.sh [--listen HOST:PORT] [--region R] [--heartbeat-timeout S]
#                       [--api-token-file F] [--bootstrap-token-file F] [--wheelhouse DIR]
#                       [--etcd-data-dir DIR] [--tls-cert F --tls-key F [--tls-ca F]]
#                       [--etcd-peer-ip IP] [--etcd-endpoints HOST:PORT,...] [--advertise URL]
#   install-controld.sh --etcd-add-member NAME=IP --etcd-bundle FILE     (on the first host: it holds the etcd CA's key)
#   install-controld.sh --etcd-join --etcd-bundle FILE --etcd-peer-ip IP [the options above]
#   install-controld.sh --uninstall [--purge]
#
# A replicated store: with --etcd-peer-ip the first control host's etcd also listens on IP (clients
# on 2379, its peers on 2380, TLS with the region's etcd CA both ways), a member that other control
# hosts can join. To add one: on the first host (the etcd CA's key is there), --etcd-add-member NAME=IP tells the cluster
# of the new member and writes FILE (mode 0600: the member's certificate, controld's client
# certificate for etcd, the API and bootstrap tokens and the sealing key, which every replica of a
# region shares); copy FILE to the new host and run --etcd-join there: its etcd joins the cluster,
# its controld lists every member. Grow one member at a time, to 3 or 5. Then give the hosts that
# were there before every member too: re-run it on each with --etcd-endpoints (a member's client
# addresses, IP:2379 each). What a host is in the cluster (its name, IP, certificate, the members
# its controld uses) is kept in /etc/twine/etcd-member: a re-run (an upgrade) keeps it.
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
# --advertise URL: how the region's other replicas and its agents reach this controld (they forward
# to the shard leaders and send heartbeats to the health checker by it); default, on a member of a
# cluster, http(s)://IP:PORT of --etcd-peer-ip and --listen's port (a re-run keeps one given).
# Re-running it upgrades the code and restarts controld (etcd keeps its data); what is not given
# again (--listen, --region, --heartbeat-timeout, TLS, the cluster) is kept from the last run.
# The installers are kept in /opt/twine/scripts: run them from there later.
# --uninstall stops and removes controld (etcd and its data stay); --purge also removes
# /etc/twine/controld.toml and the token files (the sealing key stays, as etcd's data does: the
# secret values held there are sealed with it).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
. "$src/scripts/install-lib.sh"

listen="" region="" heartbeat_timeout="" api_file="" boot_file="" wheelhouse=""
etcd_data=/var/lib/etcd/twine uninstall=0 purge=0 tls_cert="" tls_key="" tls_ca=""
peer_ip="" add_member="" bundle="" join=0 endpoints="" advertise=""
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
    --etcd-peer-ip) peer_ip=${2:?}; shift 2;;
    --etcd-add-member) add_member=${2:?}; shift 2;;
    --etcd-bundle) bundle=${2:?}; shift 2;;
    --etcd-join) join=1; shift;;
    --etcd-endpoints) endpoints=${2:?}; shift 2;;
    --advertise) advertise=${2:?}; shift 2;;
    --uninstall) uninstall=1; shift;;
    --purge) purge=1; shift;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) usage_error "unknown argument: $1";;
  esac
done
[ "$(id -u)" = 0 ] || die "run as root"
# A re-run (an upgrade, --etcd-endpoints) keeps what the last run wrote unless told otherwise.
from_conf() { [ -r /etc/twine/controld.toml ] || return 0; sed -n "s/^$1 = \"\{0,1\}\([^\"]*\)\"\{0,1\}\$/\1/p" /etc/twine/controld.toml | head -n 1; }
listen=${listen:-$(from_conf listen)} region=${region:-$(from_conf region)}
heartbeat_timeout=${heartbeat_timeout:-$(from_conf heartbeat_timeout)}
listen=${listen:-0.0.0.0:7080} region=${region:-region1} heartbeat_timeout=${heartbeat_timeout:-5}

if [ $uninstall = 1 ]; then
  have_systemd && systemctl disable --now twine-controld.service 2>/dev/null || true
  rm -f /etc/systemd/system/twine-controld.service
  have_systemd && systemctl daemon-reload
  [ $purge = 0 ] || rm -f /etc/twine/controld.toml /etc/twine/api-tokens /etc/twine/bootstrap-tokens
  echo "install-controld: twine-controld removed; etcd and its data are left as they were"
  exit 0
fi

py=/opt/twine/venv/bin/python
etcd_pki=/etc/twine/etcd-pki etcd_tls=/etc/twine/etcd-tls
valid_ip() { "${PYTHON:-python3}" -c 'import ipaddress, sys; ipaddress.ip_address(sys.argv[1])' "$1" 2>/dev/null; }

if [ -n "$add_member" ]; then
  # on a host of the cluster: tell it of a new member, and write what the new host needs
  name=${add_member%%=*} ip=${add_member#*=}
  case $add_member in *=*) ;; *) usage_error "--etcd-add-member $add_member: must be NAME=IP";; esac
  valid_ip "$ip" || usage_error "--etcd-add-member $add_member: $ip is not an IP address"
  [ -n "$bundle" ] || usage_error "--etcd-add-member needs --etcd-bundle FILE: where to write what the new host needs"
  [ -x "$py" ] && [ -e "$etcd_pki/ca-key.pem" ] || die "no region's etcd CA here ($etcd_pki): run it on a host that installed the cluster's etcd with --etcd-peer-ip"
  admin=(--endpoint 127.0.0.1:2379 --ca "$etcd_pki/ca.pem" --cert "$etcd_pki/root.pem" --key "$etcd_pki/root-key.pem")
  "$py" -m controlplane.security.pki "$etcd_pki" --server "member-$name-$ip" --ip "$ip" --ip 127.0.0.1 >/dev/null \
    || die "could not issue the member's certificate in $etcd_pki"
  clients=$("$py" -m controlplane.store.members "${admin[@]}" list | sed -n 's/.* clients=//p' | tr ',' '\n' \
            | sed -n 's|^https://||p' | grep -v '^127\.' | paste -sd, -) || die "could not list etcd's members"
  cluster=$("$py" -m controlplane.store.members "${admin[@]}" add "$name" "https://$ip:2380" | sed -n 's/^ETCD_INITIAL_CLUSTER=//p')
  [ -n "$cluster" ] || die "etcd did not take the member $name (https://$ip:2380)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp "$etcd_pki/ca.pem" "$work/ca.pem"
  cp "$etcd_pki/member-$name-$ip.pem" "$work/member.pem"
  cp "$etcd_pki/member-$name-$ip-key.pem" "$work/member-key.pem"
  cp "$etcd_pki/twine-controld.pem" "$etcd_pki/twine-controld-key.pem" "$work/"
  cp /etc/twine/api-tokens /etc/twine/bootstrap-tokens /etc/twine/secret-keys "$work/"
  printf '%s\n' "$name" > "$work/name"
  printf '%s\n' "$cluster" > "$work/cluster"
  printf '%s\n' "${clients:+$clients,}$ip:2379" > "$work/clients"
  (umask 077; tar -C "$work" -czf "$bundle" .)
  chmod 0600 "$bundle"
  echo "install-controld: etcd knows of member $name (https://$ip:2380) now; it counts toward the quorum from"
  echo "  now on: start it soon. Copy $bundle to it (it holds secrets) and run there:"
  echo "  install-controld.sh --etcd-join --etcd-bundle FILE --etcd-peer-ip $ip [--listen ... --tls-cert ... as here]"
  echo "  (taken back, if it never starts: python -m controlplane.store.members ... remove $name)"
  exit 0
fi

if [ $join = 1 ]; then
  [ -n "$bundle" ] && [ -r "$bundle" ] || usage_error "--etcd-join needs --etcd-bundle FILE (made by --etcd-add-member on the first host)"
  [ -n "$peer_ip" ] || usage_error "--etcd-join needs --etcd-peer-ip IP: this host's address, as given to --etcd-add-member"
fi
[ -z "$peer_ip" ] || valid_ip "$peer_ip" || usage_error "--etcd-peer-ip $peer_ip: not an IP address"
case $listen in *:[0-9]*) ;; *) usage_error "--listen $listen: must be HOST:PORT";; esac
case $advertise in ""|http://?*|https://?*) ;; *) usage_error "--advertise $advertise: must be an http(s) URL";; esac
if [ -n "$tls_cert$tls_key" ] && { [ -z "$tls_cert" ] || [ -z "$tls_key" ]; }; then
  usage_error "--tls-cert and --tls-key go together"
fi
for f in "$tls_cert" "$tls_key" "$tls_ca"; do [ -z "$f" ] || [ -r "$f" ] || die "$f: cannot read it"; done
command -v etcd >/dev/null || die "etcd is missing: apt-get install etcd-server"
install_code "$src" "$wheelhouse"
getent passwd twine >/dev/null || useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin twine

# etcd: loopback only (and IP with --etcd-peer-ip), TLS, and only clients with a certificate of its
# own CA; with its auth on, controld's (common name twine-controld) is the one that reaches the
# region's keys. The CA and etcd's admin's certificate (root) stay in /etc/twine/etcd-pki, root's
# alone; a re-run keeps them. A joining host has no CA key: its certificates come in the bundle.
etcd_group=$(id -gn etcd 2>/dev/null || echo root)
install -d -m 0700 "$etcd_pki"
name=$(hostname -s) cert=etcd members=""
member_state=/etc/twine/etcd-member  # what an earlier run made this host in the cluster
if [ $join = 0 ] && [ -r "$member_state" ]; then
  kept_name=$name kept_peer_ip="" kept_cert=etcd kept_members="" kept_advertise=""
  # shellcheck source=/dev/null
  . "$member_state"
  peer_ip=${peer_ip:-$kept_peer_ip} name=$kept_name cert=$kept_cert members=$kept_members
  advertise=${advertise:-$kept_advertise}
fi
if [ $join = 1 ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  tar -C "$work" -xzf "$bundle" || die "$bundle: not a bundle made by --etcd-add-member"
  name=$(cat "$work/name") cert=member
  install -m 0644 "$work/ca.pem" "$work/member.pem" "$work/twine-controld.pem" "$etcd_pki/"
  install -m 0600 "$work/member-key.pem" "$work/twine-controld-key.pem" "$etcd_pki/"
  # the region's tokens and sealing key: every replica of a region has the same
  [ -n "$api_file" ] || put_secret "$work/api-tokens" /etc/twine/api-tokens twine
  [ -n "$boot_file" ] || put_secret "$work/bootstrap-tokens" /etc/twine/bootstrap-tokens twine
  [ -s /etc/twine/secret-keys ] || put_secret "$work/secret-keys" /etc/twine/secret-keys twine
  members="127.0.0.1:2379,$(tr ',' '\n' < "$work/clients" | grep -vx "$peer_ip:2379" | paste -sd, -)"
elif [ -n "$peer_ip" ] && [ "$cert" != member ]; then  # a member others can join: its certificate for both addresses
  cert=member-$name-$peer_ip
  "$py" -m controlplane.security.pki "$etcd_pki" --server "$cert" --ip 127.0.0.1 --ip "$peer_ip" >/dev/null \
    || die "could not make etcd's certificate in $etcd_pki"
fi
if [ -e "$etcd_pki/ca-key.pem" ] || [ ! -e "$etcd_pki/ca.pem" ]; then  # not on a joined host: its CA key is elsewhere
  "$py" -m controlplane.security.pki "$etcd_pki" --server etcd --ip 127.0.0.1 --client twine-controld \
    --client root || die "could not make etcd's certificates in $etcd_pki"
fi
# --etcd-endpoints: this host's member and the others given; else what the last run kept (or this one alone)
if [ -n "$endpoints" ]; then members=127.0.0.1:2379,$endpoints; else members=${members:-127.0.0.1:2379}; fi
cat > "$member_state" <<STATE
# Written by install-controld.sh: this host in the region's etcd (re-runs keep it).
kept_name=$name
kept_peer_ip=$peer_ip
kept_cert=$cert
kept_members=$members
kept_advertise=$advertise
STATE
install -d -m 0750 -o root -g "$etcd_group" "$etcd_tls"
install -m 0644 "$etcd_pki/ca.pem" "$etcd_tls/ca.pem"
install -m 0644 "$etcd_pki/$cert.pem" "$etcd_tls/etcd.pem"
install -m 0640 -o root -g "$etcd_group" "$etcd_pki/$cert-key.pem" "$etcd_tls/etcd-key.pem"
install -d -m 0750 -o root -g twine /etc/twine/tls
install -m 0644 "$etcd_pki/ca.pem" /etc/twine/tls/etcd-ca.pem
install -m 0644 "$etcd_pki/twine-controld.pem" /etc/twine/tls/etcd-client.pem
install -m 0600 -o twine -g twine "$etcd_pki/twine-controld-key.pem" /etc/twine/tls/etcd-client-key.pem
# Debian's unit reads /etc/default/etcd. Alone: clients and peers on loopback; a member of a
# cluster: clients also on its IP, peers on its IP, TLS between members with the region's CA.
if [ -n "$peer_ip" ]; then
  clients_at=https://127.0.0.1:2379,https://$peer_ip:2379 advertised=https://$peer_ip:2379 peers=https://$peer_ip:2380
  cluster=$name=$peers state=new
  [ $join = 0 ] || { cluster=$(cat "$work/cluster"); state=existing; }
  peer_tls="ETCD_PEER_CERT_FILE=$etcd_tls/etcd.pem
ETCD_PEER_KEY_FILE=$etcd_tls/etcd-key.pem
ETCD_PEER_TRUSTED_CA_FILE=$etcd_tls/ca.pem
ETCD_PEER_CLIENT_CERT_AUTH=true"
else
  clients_at=https://127.0.0.1:2379 advertised=https://127.0.0.1:2379 peers=http://127.0.0.1:2380
  cluster=$name=$peers state=new peer_tls=""
fi
cat > /etc/default/etcd.new <<ETCD
# Written by install-controld.sh.
ETCD_NAME=$name
ETCD_DATA_DIR=$etcd_data
ETCD_LISTEN_CLIENT_URLS=$clients_at
ETCD_ADVERTISE_CLIENT_URLS=$advertised
ETCD_CERT_FILE=$etcd_tls/etcd.pem
ETCD_KEY_FILE=$etcd_tls/etcd-key.pem
ETCD_TRUSTED_CA_FILE=$etcd_tls/ca.pem
ETCD_CLIENT_CERT_AUTH=true
ETCD_LISTEN_PEER_URLS=$peers
ETCD_INITIAL_ADVERTISE_PEER_URLS=$peers
ETCD_INITIAL_CLUSTER=$cluster
ETCD_INITIAL_CLUSTER_STATE=$state
ETCD_INITIAL_CLUSTER_TOKEN=twine-$region
$peer_tls
# Larger transactions than etcd's default 128 operations: a job in one (controld's max_txn_ops).
ETCD_MAX_TXN_OPS=$max_txn_ops
ETCD_MAX_REQUEST_BYTES=33554432
# A bounded history: usage and SRM records are rewritten hourly; an hour of versions is kept.
ETCD_AUTO_COMPACTION_MODE=periodic
ETCD_AUTO_COMPACTION_RETENTION=1h
ETCD
mv /etc/default/etcd.new /etc/default/etcd
mkdir -p "$etcd_data"
chown etcd:etcd "$etcd_data" 2>/dev/null || true
chmod 0700 "$etcd_data"

# Tokens: the files given, else keep what is there, else new random ones. Bootstrap tokens expire
# a day after their file is written (controld's --bootstrap-token-ttl): an older file is renewed.
for pair in "api-tokens:$api_file" "bootstrap-tokens:$boot_file"; do
  tokens=${pair%%:*} given=${pair#*:}
  if [ -n "$given" ]; then
    put_secret "$given" "/etc/twine/$tokens" twine
  elif [ ! -s "/etc/twine/$tokens" ] || { [ "$tokens" = bootstrap-tokens ] && [ -n "$(find "/etc/twine/$tokens" -mmin +1440)" ]; }; then
    (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "/etc/twine/$tokens"; echo >> "/etc/twine/$tokens")
    chown twine:twine "/etc/twine/$tokens"
    echo "install-controld: made a new token in /etc/twine/$tokens"
  fi
  chmod 0600 "/etc/twine/$tokens"
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
  # (the installed files given again, as a re-run to change a flag may: kept as they are)
  [ "$tls_cert" -ef /etc/twine/tls/controld.pem ] || install -m 0644 "$tls_cert" /etc/twine/tls/controld.pem
  [ "$tls_key" -ef /etc/twine/tls/controld-key.pem ] \
    || install -m 0600 -o twine -g twine "$tls_key" /etc/twine/tls/controld-key.pem
  [ -z "$tls_ca" ] || [ "$tls_ca" -ef /etc/twine/tls/ca.pem ] || install -m 0644 "$tls_ca" /etc/twine/tls/ca.pem
fi
# TLS installed now or by an earlier run: a re-run without the flags keeps it (agents use https)
if [ -e /etc/twine/tls/controld.pem ] && [ -e /etc/twine/tls/controld-key.pem ]; then
  tls_conf=$'tls_cert = "/etc/twine/tls/controld.pem"\ntls_key = "/etc/twine/tls/controld-key.pem"'
  [ ! -e /etc/twine/tls/ca.pem ] || tls_conf+=$'\ntls_ca = "/etc/twine/tls/ca.pem"'
fi
# controld talks to its own host's member first, then to the other members it knows of
etcd_members=${members%,}
# Replicas forward to each other and agents heartbeat to the health checker at this URL: on a
# member of a cluster, its address (a replica that said 127.0.0.1 would be forwarded to by itself).
# An --advertise given is kept (etcd-member); the default is derived anew at each run.
if [ -z "$advertise" ] && [ -n "$peer_ip" ]; then
  scheme=http; [ -z "$tls_conf" ] || scheme=https
  advertise=$scheme://$peer_ip:${listen##*:}
fi
advertise_conf=${advertise:+advertise = \"$advertise\"}
cat > /etc/twine/controld.toml.new <<CONF
# Written by install-controld.sh; see /opt/twine/README.md and twine-controld --help.
etcd = "$etcd_members"
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
$advertise_conf
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
if [ "$cert" = member ]; then
  echo "install-controld: etcd is the cluster's member $name; its auth is the cluster's (on already)"
elif have_systemd; then
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
