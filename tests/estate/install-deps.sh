#!/usr/bin/env bash
# Install the Debian packages the test suite drives for real (idempotent:
# nothing is fetched when everything is already there). Needs root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# program -> Debian package
declare -A need=(
  [/usr/sbin/logrotate]=logrotate
  [/usr/bin/openssl]=openssl
  [/usr/bin/gunicorn]=gunicorn
  [/usr/bin/unshare]=util-linux
  [/usr/bin/fallocate]=util-linux
  [/usr/bin/ps]=procps
  [/usr/sbin/debootstrap]=debootstrap
  [/usr/bin/systemd-nspawn]=systemd-container
  [/usr/bin/nsenter]=util-linux
  [/usr/sbin/ip]=iproute2
  [/usr/bin/curl]=curl
  [/usr/bin/time]=time
  [/usr/sbin/sshd]=openssh-server
  [/usr/bin/ssh]=openssh-client
  [/usr/bin/ssh-keygen]=openssh-client
  [/usr/sbin/visudo]=sudo
  [/usr/bin/prometheus]=prometheus
  [/usr/bin/promtool]=prometheus
  [/usr/bin/prometheus-alertmanager]=prometheus-alertmanager
  [/usr/bin/amtool]=prometheus-alertmanager
  [/usr/bin/psql]=postgresql-client
  [/usr/lib/postgresql/15/bin/pg_ctl]=postgresql
  [/usr/sbin/runuser]=util-linux
  [/usr/bin/strace]=strace
  [/usr/bin/lintian]=lintian
  [/usr/sbin/haproxy]=haproxy
  [/usr/bin/socat]=socat
  [/usr/bin/supervisord]=supervisor
  [/usr/bin/objcopy]=binutils
  [/usr/bin/strip]=binutils
)
# (PostgreSQL: the tests start clusters of their own, initdb and pg_ctl as
# the postgres user in a temporary directory, on free ports.)
missing=()
for prog in "${!need[@]}"; do
  [ -x "$prog" ] || missing+=("${need[$prog]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  echo "install-deps: installing $pkgs" >&2
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  # shellcheck disable=SC2086
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $pkgs >/dev/null
fi
# `adm` is the group the logrotate tests give a log directory.
getent group adm >/dev/null || groupadd --system adm
# The account tier-1 processes run as (the package makes it with sysusers.d).
getent group systemd-journal >/dev/null || groupadd --system systemd-journal
id runwarden-observe >/dev/null 2>&1 ||
  useradd --system --no-create-home --shell /usr/sbin/nologin --groups systemd-journal runwarden-observe
