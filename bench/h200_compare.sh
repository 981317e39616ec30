#!/usr/bin/env bash
# This tree against an earlier one on one GPU, in one call: our DiT step (deterministic compile,
# fa3, ours alone) and the c=1 latency of our server (random weights, one size compiled at warmup),
# each run for both trees back to back, then the first request at a size the config did not list
# against that size's steady latency (this tree only: no request waits for a compile).
#
#   git archive REF mstar pyproject.toml | xz > .whl_base/tree.tar.xz    on this machine (the embedded
#                                                                      models' weights may be left out)
#   bash bench/h200_compare.sh wan|zimage                               on the GPU, carrying .whl_pack,
#                                                                      .whl_otel and .whl_base
# ~8 min for wan, ~4 for zimage. Results: $OUT/compare-<model>.tar.xz (JSON, tables, server logs)
# and a table printed last.
# Knobs (environment): NEW_SIZE_ONLY, SKIP_STEP and SKIP_NEW_SIZE (those phases left out), NUM_REQUESTS (3),
# ATTENTION_BACKEND (fa3), SETTLE_S (90: the longest wait for the new size's compile to be swapped in
# before its steady requests), POLL_INTERVAL (0: a video client polls when the server's
# openai-poll-after-ms hint says, as the OpenAI SDK and mstar.client do; seconds: a fixed interval).
set -uo pipefail

model=${1:?usage: bash bench/h200_compare.sh wan|zimage}
case "$model" in
  wan) served=wan2.2-ti2v-5b workload=wan-480p-t2v step=wan-480p-cfg size=832x480x33 new_size=480x832 ;;
  zimage) served=z-image-turbo workload=zimage-1024 step=zimage-1024-b1 size=1024x1024 new_size=768x1344 ;;
  tiny) served=tiny-digits workload=tiny-digits step=tiny-zimage-c2 size=256x256 new_size=128x128 ;;  # CPU plumbing
  *) echo "compare: wan or zimage (or tiny, on the CPU)" >&2; exit 2 ;;
esac
out="${OUT:-$PWD/bench-results}/compare"
mkdir -p "$out" /tmp/site /tmp/base
source "$(dirname "$0")/lib.sh"  # unpack_wheels, guarded, ready, stop_server
if [ "$model" != tiny ]; then unpack_wheels || exit 1; fi  # the GPU machine's wheels
[ -e .whl_base/tree.tar.xz ] || { echo "bring .whl_base/tree.tar.xz (see the header)" >&2; exit 2; }
tar xJf .whl_base/tree.tar.xz -C /tmp/base || exit 1
here=$PWD
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
printf 'compile_sizes: ["%s"]\ncompile_mode: deterministic\n' "$size" > /tmp/mstar-compare.yaml
gpu_flags=(--random-weights --device cuda --attention-backend "${ATTENTION_BACKEND:-fa3}")
step_flags=(--compile-modes deterministic --attention-backends "${ATTENTION_BACKEND:-fa3}")
if [ "$model" = tiny ]; then gpu_flags=(--device cpu) step_flags=(--tiny --device cpu --compile-modes off); fi

in_tree() {  # in_tree DIR COMMAND...: run with that tree's mstar first on the path
  local dir=$1
  shift
  (cd "$dir" && PYTHONPATH="/tmp/site:$dir" "$@")
}

our_step() {  # our_step LABEL DIR
  in_tree "$2" timeout -k 10 240 python3 -m mstar.cli bench step --workloads "$step" "${step_flags[@]}" --skip-diffusers \
    --num-warmup 3 --num-timed 10 -o "$out/$model-step-$1.json" > "$out/$model-step-$1.out" 2>&1
  echo "step $1: exit $?"
}

client() {  # client NAME [bench serve FLAG...]: this tree's load client against the running server
  local what=(--workload "$workload")
  [ "$model" = tiny ] && what=(--kind image)  # its one default size
  in_tree "$here" python3 -m mstar.cli bench serve --base-url http://127.0.0.1:8765 "${what[@]}" \
    --model "$served" --concurrency 1 --poll-interval "${POLL_INTERVAL:-0}" "${@:2}" -o "$out/$model-$1.json" > "$out/$model-$1.out" 2>&1
  echo "$1: exit $?"
}

serve_c1() {  # serve_c1 LABEL DIR: boot that tree's server, then c=1 (one warmup request, then timed)
  local log="$out/$model-server-$1.log" started=$SECONDS
  # setsid execs (no subshell in between), so $! leads the server's process group
  PYTHONPATH="/tmp/site:$2" setsid bash -c 'cd "$0" && exec "$@"' "$2" python3 -m mstar.cli serve "$served" \
    "${gpu_flags[@]}" --config /tmp/mstar-compare.yaml --port 8765 > "$log" 2>&1 &
  server_pid=$!
  until ready http://127.0.0.1:8765/ready; do
    if ! kill -0 "$server_pid" 2> /dev/null || [ $((SECONDS - started)) -gt 300 ]; then
      echo "serve $1: not ready; its last lines:"; tr '\r' '\n' < "$log" | tail -20; stop_server; return 4
    fi
    sleep 1
  done
  echo "serve $1: ready after $((SECONDS - started)) s"
  client "c1-$1" --num-requests "${NUM_REQUESTS:-3}" --num-warmup 1
}

settled() { grep -c "swapped in\|stays eager" "$out/$model-server-this.log"; }

new_size() {  # on the running server (this tree): the first request at new_size, then its steady c=1
  local before waited=0
  before=$(settled)  # the warmup sizes' checks are in the log already
  client "new-size-first" --size "$new_size" --num-requests 1 --num-warmup 0
  until [ "$(settled)" -gt "$before" ] || [ "$waited" -ge "${SETTLE_S:-90}" ]; do
    sleep 2
    waited=$((waited + 2))
  done
  echo "new size: its compile settled ${waited} s after its first request"
  client "new-size-steady" --size "$new_size" --num-requests "${NUM_REQUESTS:-3}" --num-warmup 0
  grep -h "not compiled yet\|swapped in\|stays eager\|recompiled" "$out/$model-server-this.log" | tail -6
}

nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
if [ -z "${NEW_SIZE_ONLY:-}" ]; then  # NEW_SIZE_ONLY=1: this tree's server and the new size alone
  if [ -z "${SKIP_STEP:-}" ]; then
    our_step base /tmp/base
    our_step this "$here"
  fi
  serve_c1 base /tmp/base
  stop_server
fi
serve_c1 this "$here" && { [ -n "${SKIP_NEW_SIZE:-}" ] || new_size; }
echo "recompile warnings in this tree's server log: $(grep -c 'recompiled in traffic' "$out/$model-server-this.log")"
stop_server

python3 - "$out" "$model" <<'EOF'
import json, sys
from pathlib import Path

out, model = Path(sys.argv[1]), sys.argv[2]

def load(name):
    path = out / f"{model}-{name}.json"
    return json.loads(path.read_text()) if path.exists() else None

def step_ms(result):
    entries = (result or {}).get("results") or [{}]
    runs = [r for r in entries[0].get("runs", []) if r.get("impl") == "mstar"]
    return runs[0].get("median_ms") if runs else None

def p50_s(result):
    runs = [r for r in (result or {}).get("runs", []) if r.get("mode") == "closed"]  # not the warmup
    return runs[0].get("latency_p50_s") if runs else None

def ratio(new, old):
    return f"{new / old:.3f}" if new and old else "-"

rows = [("DiT step ms", step_ms(load("step-base")), step_ms(load("step-this"))),
        ("c=1 p50 s", p50_s(load("c1-base")), p50_s(load("c1-this")))]
print(f"\n| {model} | base | this tree | this / base |\n|---|---|---|---|")
for name, old, new in rows:
    print(f"| {name} | {old} | {new} | {ratio(new, old)} |")
first, steady = p50_s(load("new-size-first")), p50_s(load("new-size-steady"))
print(f"| new size: first s / steady p50 s | {first} | {steady} | {ratio(first, steady)} |")
EOF
tar cf - -C "$out" . | xz > "$out/../compare-$model.tar.xz" && rm -rf "$out"  # one file comes back
