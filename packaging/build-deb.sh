#!/usr/bin/env bash
# Build the Debian package from a built binary:
#   cargo build --release --locked && packaging/build-deb.sh target/release/runwarden [OUTDIR]
# prints the .deb's path. It installs /usr/bin/runwarden, the units
# (runwarden.service, runwarden-agent.socket, runwarden-agent@.service), the
# `runwarden` system account (sysusers.d) and a default /etc/runwarden; its
# postinst makes the permit key and /etc/runwarden/agent.yaml. Nothing is
# enabled or started: configure first, then
#   systemctl enable --now runwarden-agent.socket runwarden.service
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
binary=${1:?usage: build-deb.sh BINARY [OUTDIR]}
out=${2:-$here/../target/debian}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/../Cargo.toml" | head -1)
arch=$(dpkg --print-architecture)
root=$(mktemp -d)
chmod 0755 "$root"
trap 'rm -rf "$root"' EXIT

install -D -m 0755 "$binary" "$root/usr/bin/runwarden"
for unit in runwarden.service runwarden-agent.socket runwarden-agent@.service; do
  install -D -m 0644 "$here/systemd/$unit" "$root/lib/systemd/system/$unit"
done
install -D -m 0644 /dev/stdin "$root/usr/lib/sysusers.d/runwarden.conf" <<'CONF'
u runwarden - "runwarden remediation runner" /var/lib/runwarden /usr/sbin/nologin
CONF
(cd "$here/etc" && find . -type f) | while read -r f; do
  install -D -m 0640 "$here/etc/$f" "$root/etc/$f"
done

mkdir -p "$root/DEBIAN"
(cd "$root" && find etc -type f | sed 's|^|/|' | sort) >"$root/DEBIAN/conffiles"
cat >"$root/DEBIAN/control" <<CONTROL
Package: runwarden
Version: $version
Architecture: $arch
Maintainer: runwarden maintainers <runwarden@localhost>
Depends: systemd, util-linux, libc6
Recommends: openssh-client, logrotate
Section: admin
Priority: optional
Description: runbook-scoped autonomous remediation runner
 runwarden runs named YAML runbooks on named hosts through narrow typed
 tools and one gate (kill switch, scope, allowlists, approval, budget,
 hash-chained audit line before every call).
CONTROL
cat >"$root/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  systemd-sysusers runwarden.conf
  chown -R root:runwarden /etc/runwarden
  find /etc/runwarden -type d -exec chmod 0750 {} +
  install -d -o runwarden -g runwarden -m 0750 /var/lib/runwarden
  # Root's agent on this machine takes a tier-2 call only with a permit the
  # daemon signs: make the daemon's key, and the agent's policy with its
  # public half, once.
  if [ ! -e /etc/runwarden/agent.yaml ]; then
    runuser -u runwarden -- /usr/bin/runwarden install print --host local --config /etc/runwarden \
      | awk '/^### /{p=($2=="/etc/runwarden/agent.yaml"); next} p' >/etc/runwarden/agent.yaml.new
    chmod 0640 /etc/runwarden/agent.yaml.new
    mv /etc/runwarden/agent.yaml.new /etc/runwarden/agent.yaml
  fi
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
  fi
fi
SCRIPT
cat >"$root/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = purge ]; then
  rm -rf /var/lib/runwarden /var/lib/runwarden-agent /etc/runwarden/agent.yaml
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
SCRIPT
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/postrm"

mkdir -p "$out"
deb="$out/runwarden_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"${DEB_COMPRESSION:-xz}" --build "$root" "$deb" >/dev/null
echo "$deb"
