#!/usr/bin/env python3
"""Serve a GGUF model on 127.0.0.1 with llama.cpp's OpenAI-compatible server
(the xllamacpp wheel): serve.py MODEL.gguf PORT ALIAS CHAT_TEMPLATE_FILE.
Two threads, an 8k context, one request at a time, Jinja chat templates on."""
import signal
import sys
import time

import xllamacpp

model, port, alias, template = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
params = xllamacpp.CommonParams()
params.model.path = model
params.model_alias = {alias}
params.hostnames = ["127.0.0.1"]
params.port = port
params.use_jinja = True
with open(template) as f:
    params.chat_template = f.read()
params.n_ctx = 8192
params.n_parallel = 1
params.cpuparams.n_threads = 2
params.cpuparams_batch.n_threads = 2
params.warmup = True
server = xllamacpp.Server(params)
print(f"serving {alias} on {server.listening_address}", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(3600)
