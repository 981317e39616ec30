#!/usr/bin/env bash
# The whole side-by-side comparison on the H200, in phases that each run well under 10 minutes and
# each carry less than 64 MiB (tree + .whl/). Results go to $OUT/bench/<phase>.json and .md; the
# table is printed last. Run from the project root. Estimates are from /work/shared/H200.md.
#
# Device commands, in this order, on ONE warm machine (packages installed into /tmp/site stay there
# while the machine is held, so later phases only bring what is new). Prepare .whl/ locally first:
#
#  1. baseline: diffusers pipelines end to end, eager + compiled (Wan 480p, Z-Image)    ~7 min
#     local : ../shared/tools/device-wheels.sh baseline $(bash bench/h200.sh server-deps)
#             (diffusers, PyAV, and the server's pure-Python deps pinned to .venv's versions)
#     device: bash bench/h200.sh baseline
#  2. step-wan: Wan2.2 DiT ms/step, ours (off, deterministic; fa3) vs diffusers, same weights ~6 min
#     local : ../shared/tools/device-wheels.sh engine && rm -f .whl/av-*.whl     (fa3-fwd only)
#     device: bash bench/h200.sh step-wan
#  3. step-zimage: the same for Z-Image-Turbo (1024x1024 batch 1, packed c=4)              ~4 min
#     local : rm -rf .whl                                                     (all installed already)
#     device: bash bench/h200.sh step-zimage
#  4. serve-wan: our server (wan2.2-ti2v-5b, random weights) + `mstar bench serve`, 480p   ~8 min
#     device: bash bench/h200.sh serve-wan
#  5. serve-zimage: the same for z-image-turbo 1024x1024                                 ~5 min
#     device: bash bench/h200.sh serve-zimage
#  6. baseline-720p (optional): WanPipeline 1280x704x121 eager, 1 timed call             ~5 min
#     device: bash bench/h200.sh baseline-720p
# The H200 lacks the server's deps (fastapi, uvicorn, msgspec, pyzmq, ...); `server-deps` prints them
# pinned to the local .venv (a consistent pydantic/pydantic-core pair). Each phase first lists what
# it misses and stops. On a fresh machine a phase needs its wheels again: step-* `engine` plus
# diffusers==0.42.1 importlib_metadata, less av; serve-* `engine` plus $(bash bench/h200.sh server-deps).
#
# Then locally, with the files each run brought back (files_at of each run):
#   .venv/bin/mstar bench report <files_at>/bench ... --command "bash bench/h200.sh <phase>" ...
# which adds a dated section to docs/benchmarks.md (newest first).
#
# Knobs (environment): COMPILE_MODES (off,deterministic), ATTENTION_BACKENDS (fa3),
# DIFFUSERS_MODES (eager), NUM_REQUESTS (serve, per level), CONCURRENCY, REQUEST_RATES, STEPS.
set -uo pipefail

phase="${1:?usage: bash bench/h200.sh baseline|baseline-720p|step-wan|step-zimage|serve-wan|serve-zimage|serve-tiny|server-deps}"
if [ "$phase" = server-deps ]; then  # local: the server's requirements pinned as .venv has them
  .venv/bin/python -m pip freeze | grep -iE '^(fastapi|starlette|uvicorn|h11|msgspec|pyzmq|python-multipart|prometheus.client|pydantic|pydantic.core|annotated-types|typing-inspection|anyio|sniffio|httpx|httpcore|typing.extensions|idna|certifi|click)==' | tr '\n' ' '
  exit 0
fi
out="${OUT:-$PWD/bench-results}/bench"
mkdir -p "$out"

if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false

mstar() { python3 -m mstar.cli "$@"; }

require() {  # require MODULE...: stop with a clear list of what this phase misses
  python3 - "$@" <<'EOF' || exit 3
import importlib.util, sys
missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
if missing:
    print(f"missing on this machine: {' '.join(missing)}; bring their wheels (see bench/h200.sh)", file=sys.stderr)
    sys.exit(1)
EOF
}

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

step_phase() {  # step_phase FAMILY WORKLOADS
  require torch
  mstar bench step --workloads "$2" \
    --compile-modes "${COMPILE_MODES:-off,deterministic}" \
    --attention-backends "${ATTENTION_BACKENDS:-fa3}" \
    --diffusers-modes "${DIFFUSERS_MODES:-eager}" \
    --num-warmup 3 --num-timed 10 -o "$out/step-$1.json"
}

ready() { python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" "$1" 2> /dev/null; }

serve_phase() {  # serve_phase MODEL WORKLOAD COMPILE_SIZE CONCURRENCY NUM_REQUESTS [SERVER FLAG...]
  require fastapi uvicorn msgspec zmq httpx av pydantic python_multipart prometheus_client yaml click
  local model=$1 workload=$2 size=$3 concurrency=$4 num_requests=$5
  shift 5
  local port=8765 log="$out/server-$workload.log"
  printf 'compile_sizes: ["%s"]\nmax_concurrent_requests: 16\n' "$size" > /tmp/mstar-bench.yaml
  # python3 itself in the background (not the shell function) so that $! is the server to stop
  python3 -m mstar.cli serve "$model" --config /tmp/mstar-bench.yaml --port "$port" "$@" > "$log" 2>&1 &
  local server_pid=$!
  local ready=0
  for _ in $(seq 1 300); do  # boot: random weights, warmup compile (up to 5 minutes)
    if ready "http://127.0.0.1:$port/ready"; then ready=1; break; fi
    kill -0 "$server_pid" 2> /dev/null || break
    sleep 1
  done
  if [ "$ready" != 1 ]; then
    echo "server did not become ready; last lines of $log:"; tail -30 "$log"
    kill "$server_pid" 2> /dev/null; exit 4
  fi
  echo "server ready after ${SECONDS}s"
  local steps_flag=()
  [ -n "${STEPS:-}" ] && steps_flag=(--steps "$STEPS")
  local workload_flag=(--workload "$workload")
  [ "$workload" = tiny-digits ] && workload_flag=(--kind image)  # its one size is the model's default
  mstar bench serve --base-url "http://127.0.0.1:$port" "${workload_flag[@]}" --model "$model" \
    --concurrency "${CONCURRENCY:-$concurrency}" --request-rate "${REQUEST_RATES:-}" \
    --num-requests "${NUM_REQUESTS:-$num_requests}" --num-warmup 1 "${steps_flag[@]}" -o "$out/serve-$workload.json"
  local status=$?
  kill "$server_pid"; wait "$server_pid" 2> /dev/null
  return $status
}

case "$phase" in
  baseline)
    require diffusers
    mstar bench diffusers --workloads wan-480p-t2v,zimage-1024 --modes "${DIFFUSERS_MODES:-eager,compiled}" \
      --num-warmup 1 --num-timed 3 -o "$out/diffusers.json" ;;
  baseline-720p)
    require diffusers
    mstar bench diffusers --workloads wan-720p-t2v --modes eager --num-warmup 1 --num-timed 1 \
      -o "$out/diffusers-720p.json" ;;
  step-wan) step_phase wan wan-480p-b1,wan-480p-cfg,wan-480p-c4,wan-720p-b1 ;;
  step-zimage) step_phase zimage zimage-1024-b1,zimage-1024-c4 ;;
  serve-wan | serve-zimage)
    gpu_flags=(--random-weights --device cuda --attention-backend "${ATTENTION_BACKENDS:-fa3}" --compile-mode deterministic)
    if [ "$phase" = serve-wan ]; then
      serve_phase wan2.2-ti2v-5b wan-480p-t2v 832x480x33 1,2,4 4 "${gpu_flags[@]}"
    else
      serve_phase z-image-turbo zimage-1024 1024x1024 1,4,8 8 "${gpu_flags[@]}"
    fi ;;
  serve-tiny) serve_phase tiny-digits tiny-digits 256x256 1,2 4 --device cpu ;;  # CPU smoke test of this script
  *) echo "unknown phase '$phase'" >&2; exit 2 ;;
esac
status=$?
echo "== $phase: exit $status, ${SECONDS}s; results in $out"
for table in "$out"/*.md; do [ -e "$table" ] && { echo; cat "$table"; }; done
exit $status
