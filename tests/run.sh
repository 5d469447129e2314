#!/usr/bin/env bash
# Every test: installs what the tests drive for real (Debian packages), builds
# the systemd test hosts' root filesystem once (cached), then runs the whole
# cargo test suite. Needs root (mount namespaces, systemd-nspawn).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "tests/run.sh needs root (mount namespaces, systemd-nspawn); run it with sudo" >&2; exit 2; }
tests/estate/install-deps.sh
cargo test --locked
