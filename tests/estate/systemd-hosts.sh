#!/usr/bin/env bash
# Real systemd test hosts for runwarden's integration tests.
#
# A Debian 12 root filesystem (debootstrap, cached) booted with systemd-nspawn:
# systemd is PID 1 inside the container even though it is not PID 1 on the
# machine running the tests. Every host boots from the same read-only tree
# (--volatile=overlay) with a private network, its own /var/log on a 16 MiB
# tmpfs (so "disk full" is a real full filesystem), and a per-test directory
# bind-mounted at /srv/runwarden (runwarden's config, state and audit log) and
# /etc/ssl/runwarden (the certificate nginx serves).
#
# usage:
#   systemd-hosts.sh build                 debootstrap + customise (cached; rebuilt when the package list changes)
#   systemd-hosts.sh boot NAME DIR BINARY [NETNS]
#                                          exec systemd-nspawn for host NAME (run it in the background);
#                                          in network namespace NETNS (see net-up) instead of a private one
#   systemd-hosts.sh net-up NAME INDEX     a network namespace rw-sd-NAME whose eth0 is 10.238.INDEX.2,
#                                          reached from the machine over a veth at 10.238.INDEX.1
#   systemd-hosts.sh net-down NAME INDEX   remove it
#   systemd-hosts.sh cleanup NAME          remove what nspawn leaves behind after it exited
#
# Env: RUNWARDEN_ESTATE_CACHE (default /var/tmp/runwarden-estate)
set -euo pipefail

CACHE=${RUNWARDEN_ESTATE_CACHE:-/var/tmp/runwarden-estate}
ROOT=$CACHE/rootfs
PACKAGES=systemd,systemd-sysv,dbus,openssh-server,nginx-light,logrotate,procps,iproute2,openssl,sudo,ca-certificates,libnss-myhostname
STAGE2=3   # bump when the customisation below changes

log() { printf '[systemd-hosts] %s\n' "$*" >&2; }

mirror() {  # the Debian mirror this machine's apt already uses
  { grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
    grep -h '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}'; } | grep -v security | head -1
}

build() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.lock"
  flock 9   # several test processes may ask at once; one builds
  if [ "$(cat "$ROOT/.packages" 2>/dev/null)" != "$PACKAGES" ]; then
    local t0=$SECONDS
    rm -rf "$ROOT"
    log "debootstrap into $ROOT (once; cached)"
    debootstrap --variant=minbase --include="$PACKAGES" bookworm "$ROOT" "$(mirror)" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    echo "$PACKAGES" >"$ROOT/.packages"
    rm -f "$ROOT/.stage2"
    log "debootstrap took $((SECONDS - t0)) s"
  fi
  [ "$(cat "$ROOT/.stage2" 2>/dev/null)" = "$STAGE2" ] && return 0

  # One tree, many hosts: strip per-host identity.
  : >"$ROOT/etc/machine-id"
  rm -f "$ROOT/etc/hostname" "$ROOT"/etc/ssh/ssh_host_*
  # /var/log is a tmpfs per host: recreate what the packages expect there.
  cat >"$ROOT/etc/tmpfiles.d/runwarden-estate.conf" <<'CONF'
d /var/log/nginx 0755 root adm -
d /var/log/app 0755 root root -
CONF
  # An application log that logrotate handles through /etc/logrotate.conf.
  cat >"$ROOT/etc/logrotate.d/app" <<'CONF'
/var/log/app/*.log {
    rotate 2
    compress
    missingok
    notifempty
}
CONF
  # nginx: a health endpoint on :80, TLS on :443 with the certificate the test provides.
  cat >"$ROOT/etc/nginx/sites-available/default" <<'CONF'
server {
    listen 80 default_server;
    location = /health { return 200 "ok\n"; }
    location / { return 200 "staging\n"; }
}
server {
    listen 443 ssl default_server;
    ssl_certificate /etc/ssl/runwarden/web.pem;
    ssl_certificate_key /etc/ssl/runwarden/web.key;
    location / { return 200 "tls\n"; }
}
CONF
  # A unit with a reload action and one that fails, for the service tools.
  cat >"$ROOT/etc/systemd/system/demo.service" <<'CONF'
[Unit]
Description=runwarden estate demo worker
[Service]
ExecStart=/bin/sh -c 'trap "echo reloaded" HUP; while :; do sleep 1 & wait $!; done'
ExecReload=/bin/kill -HUP $MAINPID
[Install]
WantedBy=multi-user.target
CONF
  cat >"$ROOT/etc/systemd/system/broken.service" <<'CONF'
[Unit]
Description=runwarden estate unit that fails on start
[Service]
ExecStart=/bin/sh -c 'echo "<3>config error: /etc/broken.conf line 3" >&2; exit 3'
CONF
  ln -sf /etc/systemd/system/demo.service "$ROOT/etc/systemd/system/multi-user.target.wants/demo.service"
  # Nothing in the tests needs these, and they slow the boot down.
  for unit in ssh.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer man-db.timer dpkg-db-backup.timer; do
    rm -f "$ROOT"/etc/systemd/system/*.wants/"$unit"
  done
  echo "$STAGE2" >"$ROOT/.stage2"
  log "root filesystem ready ($(du -sh "$ROOT" | cut -f1))"
}

cg_hierarchies() {  # a dedicated cgroup per container (hybrid v1+v2 here; pure v2 elsewhere)
  if [ -d /sys/fs/cgroup/unified ]; then echo /sys/fs/cgroup/unified /sys/fs/cgroup/systemd
  else echo /sys/fs/cgroup; fi
}

boot() {
  local name=$1 dir=$2 binary=$3 net=--private-network
  [ -n "${4:-}" ] && net="--network-namespace-path=/run/netns/$4"
  [ -f "$ROOT/.stage2" ] || { log "run '$0 build' first"; exit 1; }
  # nspawn --keep-unit (there is no systemd on the machine to ask for a scope) nests under this cgroup.
  for h in $(cg_hierarchies); do
    mkdir -p "$h/runwarden-estate-$name"
    echo $$ >"$h/runwarden-estate-$name/cgroup.procs"
  done
  exec systemd-nspawn --quiet --directory="$ROOT" --volatile=overlay --machine="$name" \
    --register=no --keep-unit "$net" \
    --tmpfs=/var/log:size=16M,mode=755 \
    --bind="$dir/config:/srv/runwarden" \
    --bind="$dir/ssl:/etc/ssl/runwarden" \
    --bind-ro="$binary:/usr/local/bin/runwarden" \
    --boot --console=read-only </dev/null
}

cleanup() {
  local name=$1
  for h in $(cg_hierarchies); do
    [ -d "$h/runwarden-estate-$name" ] && find "$h/runwarden-estate-$name" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  rmdir "/run/systemd/nspawn/propagate/$name" 2>/dev/null || true
  return 0
}

net_up() {
  local ns="rw-sd-$1" veth="rwd$2" i=$2
  net_down "$@"
  ip netns add "$ns"
  ip link add "$veth" type veth peer name eth0 netns "$ns"
  ip addr add "10.238.$i.1/24" dev "$veth"; ip link set "$veth" up
  ip -n "$ns" addr add "10.238.$i.2/24" dev eth0; ip -n "$ns" link set eth0 up; ip -n "$ns" link set lo up
}

net_down() {
  ip netns del "rw-sd-$1" 2>/dev/null || true
  ip link del "rwd$2" 2>/dev/null || true
}

case "${1:-}" in
  build) build ;;
  net-up) shift; net_up "$@" ;;
  net-down) shift; net_down "$@" ;;
  boot) shift; boot "$@" ;;
  cleanup) shift; cleanup "$@" ;;
  *) sed -n '2,25p' "$0"; exit 2 ;;
esac
