#!/usr/bin/env bash
# Named hosts over SSH for runwarden's tests: Debian's sshd in a network
# namespace of its own, reached over a veth pair, with its own host key and an
# unprivileged account whose only way in is the forced-command agent.
#
# usage:
#   ssh-hosts.sh up NAME INDEX DIR AGENT [COMMAND]
#                                          start host NAME at 10.239.INDEX.2; DIR holds
#                                          client_key.pub and agent.yaml; writes DIR/ssh_host_ed25519_key.pub.
#                                          COMMAND replaces the forced command (a broken agent, for tests).
#   ssh-hosts.sh down NAME INDEX DIR       stop it and remove the namespace
#
# Env: RW_PLAIN_USER=NAME also lets account NAME in with the same key and an
# ordinary shell (no forced command): for benchmarks against Ansible only.
set -euo pipefail
USER_NAME=rw-agent

up() {
  local name=$1 i=$2 dir=$3 agent=$4 ns="rw-ssh-$1" veth="rws$2"
  # Tests boot hosts in parallel; /etc/passwd is edited by one at a time.
  exec 8>/run/runwarden-ssh-hosts.lock
  flock 8
  getent passwd "$USER_NAME" >/dev/null || \
    useradd --system --create-home --home-dir /var/lib/$USER_NAME --shell /bin/sh --password '*' "$USER_NAME"
  # sshd runs the forced command through the user's shell, which must be a real one,
  # and a `useradd --system` account is locked ("!") unless given a password of '*'.
  usermod --password '*' --shell /bin/sh "$USER_NAME"
  flock -u 8
  mkdir -p "$dir/jail" /run/sshd
  rm -f "$dir/ssh_host_ed25519_key" "$dir/ssh_host_ed25519_key.pub"
  ssh-keygen -q -t ed25519 -N '' -C "$name" -f "$dir/ssh_host_ed25519_key"
  down "$name" "$i"   # whatever a killed test run left behind under this name
  local forced=${5:-"$agent agent --stdio --policy $dir/agent.yaml --audit $dir/agent-audit.jsonl"}
  printf 'command="%s",restrict %s\n' "$forced" "$(cat "$dir/client_key.pub")" > "$dir/authorized_keys.$USER_NAME"
  local allow=$USER_NAME
  if [ -n "${RW_PLAIN_USER:-}" ]; then
    flock 8
    getent passwd "$RW_PLAIN_USER" >/dev/null || \
      useradd --system --create-home --home-dir "/var/lib/$RW_PLAIN_USER" --shell /bin/sh --password '*' "$RW_PLAIN_USER"
    flock -u 8
    cp "$dir/client_key.pub" "$dir/authorized_keys.$RW_PLAIN_USER"
    allow="$allow $RW_PLAIN_USER"
  fi
  chown -R "$USER_NAME" "$dir/jail"
  touch "$dir/agent-audit.jsonl" && chown "$USER_NAME" "$dir/agent-audit.jsonl"
  # Where the host records the permits its agents spent (the policy's
  # spent_permits, beside the jail by default; the directory here is root's,
  # as /var/lib/runwarden is the agent's own).
  install -d -o "$USER_NAME" -m 0700 "$dir/agent-permits"
  chmod 755 "$dir"; chmod 644 "$dir"/authorized_keys.* "$dir/agent.yaml"
  cat > "$dir/sshd_config" <<CONF
ListenAddress 10.239.$i.2
Port 22
HostKey $dir/ssh_host_ed25519_key
AuthorizedKeysFile $dir/authorized_keys.%u
PidFile $dir/sshd.pid
AllowUsers $allow
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM no
StrictModes no
MaxStartups 100
CONF
  ip netns add "$ns"
  ip link add "$veth" type veth peer name eth0 netns "$ns"
  ip addr add "10.239.$i.1/24" dev "$veth"; ip link set "$veth" up
  ip -n "$ns" addr add "10.239.$i.2/24" dev eth0; ip -n "$ns" link set eth0 up; ip -n "$ns" link set lo up
  ip netns exec "$ns" /usr/sbin/sshd -f "$dir/sshd_config" -E "$dir/sshd.log" </dev/null >/dev/null 2>&1
  for _ in $(seq 1 50); do [ -s "$dir/sshd.pid" ] && break; sleep 0.1; done
  [ -s "$dir/sshd.pid" ] || { cat "$dir/sshd.log" >&2; exit 1; }
}

down() {
  local name=$1 i=$2 ns="rw-ssh-$1"
  # Every process in the namespace (the listener and its sessions), then the namespace and its link.
  ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  ip link del "rws$i" 2>/dev/null || true
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) shift; down "$@" ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
