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
# What ships is what is tested: the binary exactly as the package builds it
# (packaging/build-deb.sh takes target/release/runwarden). Every tier drives
# it for the commands it runs (RUNWARDEN_BIN); tests/shipped/ drives nothing
# else. The test build's own binary is driven only where a test needs its
# fault-injection hook, which no release carries.
cargo build --release --locked
export RUNWARDEN_BIN="$PWD/target/release/runwarden"
cargo test --locked --features estate
