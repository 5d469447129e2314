#!/usr/bin/env bash
# Install the MCP client the tests drive runwarden with (the reference Python
# SDK, pinned in mcp-client.txt) into a virtual environment of its own, once:
# nothing is fetched when it is already there. Prints the environment's python.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pins="$here/mcp-client.txt"
venv=/var/cache/runwarden-tests/mcp-$(sha256sum "$pins" | cut -c1-12)
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$pins" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/python"
