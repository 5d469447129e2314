#!/usr/bin/env bash
# Every test: installs what the tests drive for real (Debian packages), builds
# the systemd test hosts' root filesystem once (cached), then runs the whole
# cargo test suite. Needs root (mount namespaces, systemd-nspawn).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "tests/run.sh needs root (mount namespaces, systemd-nspawn); run it with sudo" >&2; exit 2; }
if ! command -v cargo >/dev/null; then
  # sudo's secure_path drops ~/.cargo/bin: use the toolchain of whoever ran sudo.
  home=$(getent passwd "${SUDO_USER:-root}" | cut -d: -f6)
  if [ -x "$home/.cargo/bin/cargo" ]; then
    export PATH="$home/.cargo/bin:$PATH"
    export RUSTUP_HOME="${RUSTUP_HOME:-$home/.rustup}" CARGO_HOME="${CARGO_HOME:-$home/.cargo}"
  fi
fi
command -v cargo >/dev/null || { echo "tests/run.sh: cargo not found (install Rust with rustup first)" >&2; exit 2; }
tests/estate/install-deps.sh
cargo test --locked --features estate
