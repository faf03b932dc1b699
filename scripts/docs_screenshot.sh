#!/usr/bin/env bash
# Regenerate the throughput page's images: a demo run, a TensorBoard server on 127.0.0.1 and a
# headless Chromium screenshot of its scalars page (docs/img/tensorboard-throughput.png), and
# `tfdp-utils report --plot` over the same logs (docs/img/report-throughput.png).
# Needs Debian's chromium package.
set -euo pipefail
cd "$(dirname "$0")/.."
logs=$(mktemp -d)
tfdp-utils demo --log-dir "$logs" --epochs 8 >/dev/null
port=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
tensorboard --logdir "$logs" --host 127.0.0.1 --port "$port" >/dev/null 2>&1 &
tb=$!
trap 'kill $tb' EXIT
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/data/runs" >/dev/null && break; sleep 1; done
mkdir -p docs/img
profile=$(mktemp -d)
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --window-size=1400,1000 --virtual-time-budget=15000 \
  --screenshot=docs/img/tensorboard-throughput.png \
  "http://127.0.0.1:$port/?darkMode=false#scalars&tagFilter=throughput"
# The same run through `tfdp-utils report`: the plot on the throughput page.
tfdp-utils report "$logs" --plot docs/img/report-throughput.png
