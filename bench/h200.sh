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
#
# Issue 8 in two calls, each on a fresh machine (< 9.5 min; internal `timeout` guards keep what was
# measured: every suite phase rewrites its JSON as it ends).
#  call1: carry .whl_fa3 .whl_srv .whl_otel (fa3-fwd, the server's deps): the DiT step profile
#         (Wan 480p pair + 720p, Z-Image 1024; deterministic, fa3), the GPU tests, then the Z-Image
#         serving profile. CALL_BUDGET_S=565.
#  call2: carry .whl_pack (made here by `bash bench/h200.sh pack .whl_av .whl_fa3 .whl_srv .whl_otel`:
#         the wheels unpacked and xz-compressed, 38 MB): the Wan serving profile, the two-fresh-servers
#         determinism test on CUDA, then the GPU tests. CALL_BUDGET_S=555.
#  serve-wan-offload: carry .whl_pack, right after call2 on the same machine (a warm compile cache):
#         Wan at c=1 with offload_text_encoder (peak memory, the prompt's cost).
#  confirm / probe-repeat: carry .whl_pack; Wan's cold request against its repeats (probe-repeat
#         with MSTAR_TRACE_TENSORS: where two runs of a prompt and seed part ways, eager and compiled).
#  call4: carry .whl_pack; Wan's serving profile, then Wan with offload_text_encoder (peaks).
#  call7: carry .whl_pack; the kernels: GPU tests, A/B step profiles (Z-Image 1024, 512; Wan).
#  call9: carry .whl_pack; the Wan suite at the defaults.
#  call10: carry .whl_pack; Z-Image suites at 512x512 with the kernels off and on.
#  call14: carry .whl_pack; Wan 480p and Z-Image 512 step profiles, kernels off and on, with the
#          host's side: cProfile, and wall / thread CPU / process CPU while a step launches.
#  call15: carry .whl_pack; the Z-Image suite at the defaults (kernels on), then a second fresh
#          server's first image: the same bytes as the first server's?
#  call16: carry .whl_pack; Wan's DiT step at the defaults (kernels on): 480p guidance pair, 720p.
#  call17: carry .whl_pack; the MP4 encode by x264 thread count, whole and streamed; Wan at c=1
#          with clips muxed whole, then streamed to the muxer as the VAE decodes.
#  call18: carry .whl_pack; Z-Image 1024 and Wan 480p at c=1 only: a request's time by stage.
#  call19: carry .whl_pack; the encodes, then Z-Image 1024 at c=1 (after the PNG writer's rework).
#  call20: carry .whl_pack; Wan's prompt encoder under CUDA graphs (GPU test), then Wan at c=1.
#  call21: carry .whl_pack; both VAE decodes by kernel kind, and their variants (mstar.bench.vae_profile).
#  call22: carry .whl_pack; the Z-Image VAE GPU test, the Z-Image suite, a second fresh server's image.
#  call23: carry .whl_pack; Wan 832x480x33 at c=1 (6 steady requests).
#  call24: carry .whl_pack; Z-Image 1024 at c=1 (8 steady requests).
#  call25: carry .whl_pack; x264 settings on this host; Wan 832x480x33 at c=1, polled every 50 ms and
#          following the server's hint.
#  call26: carry .whl_pack; Wan 832x480x33 at c=1 with each video's timeline from the server log.
#  call27: carry .whl_pack; the threads using the host's CPU while a Wan request runs (OMP default, 4).
#  call28/call29: carry .whl_pack; the Wan decode's GPU test and profile (call29: with the residual sums
#          pinned channels-last in the graph, and inductor's code logged).
#  call30: carry .whl_pack; x264's thread types and B-frames (mp4 only), then Wan 832x480x33 at c=1.
#  step-autotune: carry .whl_pack; Wan's guidance pair step, deterministic against max-autotune.
#  call31: carry .whl_pack; Wan 832x480x33 at c=1 with status polls held to the job's end, polled
#          every 50 ms, then following the server's hint.
#  batch-scaling: carry .whl_pack; our DiT step alone and packed (Wan 1 and 4 guidance pairs, Z-Image 1,
#          4 and 8 images), with the SM clock and power beside it: what packing gains a request.
#  call3: carry .whl_pack; the encodes (PNG, MP4), Z-Image's profile with inductor's code, its suite.
# Phases that later ones replaced (kernels, call5, call6, call8, call11, call12, call13) are in the git
# history; each run in docs/benchmarks.md names the commit it ran.
# `profile` alone: the kernel profiles in two compile modes and Z-Image's stages (carry .whl_fa3).
# The serving profile is `mstar bench serve-suite` (mstar/bench/serve_suite.py) right after /ready:
# cold request, steady c=1, high c, mixed sizes, recompiles from /metrics, same-seed parity.
# CALL_BUDGET_S (490) bounds each call; serve-tiny runs the same plumbing on CPU.
set -uo pipefail

phase="${1:?usage: bash bench/h200.sh call1|call2|call3|call4|call7|call9|call10|call14|call15|call16|call17|call18|call19|call20|call21|call22|call23|call24|call25|call26|call27|call28|call29|call30|call31|batch-scaling|step-autotune|gemm-sustained|encodes|vae-code|confirm|serve-wan-offload|probe-repeat|diag-text|profile|pack|serve-zimage-suite|baseline|baseline-720p|step-wan|step-zimage|flux2|step-wan-targets|step-zimage-targets|serve-wan|serve-zimage|serve-tiny|server-deps}"
if [ "$phase" = pack ]; then  # local: pack WHEEL_DIR... -> .whl_pack/site.tar.xz (the wheels unpacked)
  shift
  staging=$(mktemp -d)
  for wheel in $(for dir in "$@"; do ls "$dir"/*.whl; done); do python3 -m zipfile -e "$wheel" "$staging/"; done
  mkdir -p .whl_pack && tar cf - -C "$staging" . | xz -T0 -6 > .whl_pack/site.tar.xz && rm -rf "$staging"
  ls -la .whl_pack
  exit 0
fi
if [ "$phase" = server-deps ]; then  # local: the server's requirements pinned as .venv has them
  .venv/bin/python -m pip freeze | grep -iE '^(fastapi|starlette|uvicorn|uvloop|httptools|h11|msgspec|pyzmq|python-multipart|prometheus.client|pydantic|pydantic.core|annotated-types|typing-inspection|anyio|sniffio|httpx|httpcore|typing.extensions|idna|certifi|click|opentelemetry.api)==' | tr '\n' ' '
  exit 0
fi
deadline=$((SECONDS + ${CALL_BUDGET_S:-490}))  # call1/call2: everything ends (results written) by then
out="${OUT:-$PWD/bench-results}/bench"
mkdir -p "$out"

# call1/call2 install only their own wheel folders: a folder left by an earlier call (e.g. diffusers)
# must not change what they measure.
case "$phase" in
  call1 | serve-zimage-suite | serve-zimage-eager | diag-text) wheel_dirs=(.whl_fa3 .whl_srv .whl_otel) ;;
  profile) wheel_dirs=(.whl_fa3) ;;
  call2 | call3 | call4 | call7 | call9 | call10 | call14 | call15 | call16 | call17 | call18 | call19 | call20 | call21 | call22 | call23 | call24 | call25 | call26 | call27 | call28 | call29 | call30 | call31 | batch-scaling | step-autotune | encodes | vae-code | confirm | probe-repeat | serve-wan-offload)  # a fresh machine: carry .whl_pack (`bash bench/h200.sh pack .whl_av .whl_fa3 .whl_srv .whl_otel`)
    wheel_dirs=() ;;
  *) read -r -a wheel_dirs <<< "${WHEEL_DIRS:-.whl}" ;;  # e.g. WHEEL_DIRS=".whl_fa3 .whl_srv"
esac
wheels=()
for wheel_dir in "${wheel_dirs[@]}"; do
  for wheel in "$wheel_dir"/*.whl; do [ -e "$wheel" ] && wheels+=("$wheel"); done
done
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${wheels[@]}" || exit 1
fi
# .whl_pack/*.tar.xz: wheels unpacked and xz-compressed (PyAV + fa3-fwd + the server's deps fit the
# 64 MiB carry only this way; make one with `bash bench/h200.sh pack DIR...`).
for pack in .whl_pack/*.tar.xz; do
  [ -e "$pack" ] && { mkdir -p /tmp/site && tar xJf "$pack" -C /tmp/site || exit 1; }
done
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false

mstar() { python3 -m mstar.cli "$@"; }
left_s() { echo $((deadline - SECONDS)); }
now_s() { date +%s.%N; }

missing() {  # missing MODULE...: prints the ones this machine lacks; status 1 when any
  python3 - "$@" <<'EOF'
import importlib.util, sys
missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
if missing:
    print(f"missing on this machine: {' '.join(missing)}; bring their wheels (see bench/h200.sh)", file=sys.stderr)
    sys.exit(1)
EOF
}
require() { missing "$@" || exit 3; }  # require MODULE...: stop with a clear list of what this phase misses
SERVER_MODULES=(fastapi starlette uvicorn h11 click msgspec zmq httpx anyio pydantic pydantic_core python_multipart prometheus_client yaml opentelemetry)

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2> /dev/null || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

step_phase() {  # step_phase FAMILY WORKLOADS
  require torch
  mstar bench step --workloads "$2" \
    --compile-modes "${COMPILE_MODES:-off,deterministic}" \
    --attention-backends "${ATTENTION_BACKENDS:-fa3}" \
    --diffusers-modes "${DIFFUSERS_MODES:-eager}" \
    --num-warmup 3 --num-timed 10 -o "$out/step-$1.json"
}

our_step() {  # our_step NAME WORKLOAD LIMIT_S: our DiT only (deterministic, fa3), under a time guard
  local limit=$(($3 < $(left_s) ? $3 : $(left_s)))
  [ "$limit" -gt 20 ] || { echo "step $1: skipped (time guard)"; return 0; }
  timeout -k 10 "$limit" python3 -m mstar.cli bench step --workloads "$2" --compile-modes deterministic \
    --attention-backends "${ATTENTION_BACKENDS:-fa3}" --skip-diffusers --num-warmup 2 --num-timed 5 \
    -o "$out/step-$1.json" > "$out/step-$1.out" 2>&1
  local status=$?
  [ "$status" = 124 ] && echo "step $1: stopped by the time guard after ${limit}s"
  [ "$status" != 0 ] && tail -5 "$out/step-$1.out"
  echo "step $1: exit $status at ${SECONDS}s"
}

guarded() {  # guarded NAME LIMIT_S COMMAND...: under the call's deadline, output kept in $out/NAME.out
  local name=$1 limit=$(($2 < $(left_s) ? $2 : $(left_s)))
  shift 2
  [ "$limit" -gt 20 ] || { echo "$name: skipped (time guard)"; return 0; }
  timeout -k 10 "$limit" "$@" > "$out/$name.out" 2>&1
  echo "$name: exit $? at ${SECONDS}s"
}

# The SM clock, power and temperature every 250 ms into $out/gpu-clocks.txt, while a phase runs.
sample_gpu_clocks() {
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 250 > "$out/gpu-clocks.txt" &
  gpu_clocks_pid=$!
}
stop_gpu_clocks() { kill "$gpu_clocks_pid"; }

ready() { python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" "$1" 2> /dev/null; }

server_pid=""
start_server() {  # start_server MODEL LOG COMPILE_SIZES_JSON [SERVER FLAG...]; sets server_pid
  local model=$1 log=$2 sizes=$3
  shift 3
  printf 'compile_sizes: %s\nmax_concurrent_requests: 16\n%s\n' "$sizes" "${EXTRA_CONFIG:-}" > /tmp/mstar-bench.yaml
  # its own process group (setsid), so that stopping it stops its workers too
  setsid python3 -m mstar.cli serve "$model" --config /tmp/mstar-bench.yaml --port 8765 "$@" > "$log" 2>&1 &
  server_pid=$!
}

stop_server() {
  [ -n "$server_pid" ] || return 0
  kill -TERM -- "-$server_pid" 2> /dev/null
  for _ in $(seq 1 20); do kill -0 "$server_pid" 2> /dev/null || break; sleep 0.5; done
  kill -KILL -- "-$server_pid" 2> /dev/null
  wait "$server_pid" 2> /dev/null
  server_pid=""
}
trap stop_server EXIT

boot_s=""
wait_ready() {  # wait_ready LOG MAX_S STARTED: sets boot_s (seconds from STARTED, a `now_s`, to /ready)
  local log=$1 max_s=$2 started=$3 until_s=$((SECONDS + $2))
  while [ "$SECONDS" -lt "$until_s" ]; do
    if ready "http://127.0.0.1:8765/ready"; then
      boot_s=$(awk -v a="$started" -v b="$(now_s)" 'BEGIN { printf "%.1f", b - a }')
      echo "server ready after ${boot_s}s (at ${SECONDS}s)"
      return 0
    fi
    kill -0 "$server_pid" 2> /dev/null || break
    sleep 1
  done
  echo "server not ready (waited up to ${max_s}s; at ${SECONDS}s); last lines of $log:"
  tr '\r' '\n' < "$log" | tail -30
  return 4
}

suite_phase() {  # suite_phase MODEL WORKLOAD COMPILE_SIZES_JSON RESERVE_S SUITE_ARG... -- SERVER_FLAG...
  local model=$1 workload=$2 sizes=$3 reserve_s=$4 suite_args=() log="$out/server-$2.log" started
  shift 4
  while [ $# -gt 0 ] && [ "$1" != -- ]; do suite_args+=("$1"); shift; done
  shift
  missing "${SERVER_MODULES[@]}" || return 3
  started=$(now_s)
  start_server "$model" "$log" "$sizes" "$@"
  wait_ready "$log" $(($(left_s) - reserve_s)) "$started" || { stop_server; return 4; }
  local limit=$(($(left_s) - 15))  # 15 s to stop the server and print
  [ "$limit" -gt 20 ] || { echo "suite $workload: no time left"; stop_server; return 5; }
  timeout -k 5 "$limit" python3 -m mstar.cli bench serve-suite --base-url http://127.0.0.1:8765 \
    --workload "$workload" --model "$model" --boot-s "$boot_s" --max-duration $((limit - 10)) \
    "${suite_args[@]}" -o "$out/suite-$workload.json" > "$out/suite-$workload.out" 2>&1
  local status=$?
  [ "$status" = 124 ] && echo "suite $workload: stopped by the time guard after ${limit}s (phases done are in the JSON)"
  [ "$status" != 0 ] && tail -5 "$out/suite-$workload.out"
  echo "recompile warnings in the server log: $(grep -c 'recompiled' "$log")"
  [ -n "${KEEP_SERVER:-}" ] || stop_server  # KEEP_SERVER=1: the caller measures more, then stops it
  echo "suite $workload: exit $status at ${SECONDS}s"
  return $status
}

zimage_suite() {  # the Z-Image serving profile every call uses (1024, c=8, company for parity)
  suite_phase z-image-turbo zimage-1024 '["1024x1024", "768x1024"]' 45 \
    --num-steady 5 --high-concurrency 8 --num-high 16 --num-mixed 0 --company-sizes 768x1024,768x1024 \
    -- "${gpu_flags[@]}"
}

wan_suite() {  # the Wan serving profile every call uses (480p both orientations, c=4, mixed)
  suite_phase wan2.2-ti2v-5b wan-480p-t2v '["832x480x33", "480x832x33"]' 150 \
    --sizes 832x480,480x832 --num-steady 3 --high-concurrency 4 --num-high 8 --num-mixed 8 \
    --poll-interval 0.05 -- "${gpu_flags[@]}"
}

same_cold_output() {  # same_cold_output LABEL SUITE_A.json SUITE_B.json OUT.txt: the cold requests' bytes
  python3 -c "import json, sys; a, b = (json.load(open(p))['cold']['media_sha256'] for p in sys.argv[2:])
print(sys.argv[1] + ':', 'identical bytes' if a == b else 'DIFFERENT', a[:16], b[:16])" "$1" "$2" "$3" | tee "$4"
}

wan_c1() {  # wan_c1 NUM_STEADY RESERVE_S: Wan 832x480x33 at c=1 only, its one size compiled
  suite_phase wan2.2-ti2v-5b wan-480p-t2v '["832x480x33"]' "$2" --sizes 832x480 \
    --num-steady "$1" --num-high 0 --num-mixed 0 --poll-interval 0.05 -- "${gpu_flags[@]}"
}

wan_c1_following_hint() {  # after `KEEP_SERVER=1 wan_c1`: 4 more Wan requests at c=1 on that server,
  # each polled when the server's openai-poll-after-ms hint says (as mstar.client polls)
  [ -n "$server_pid" ] && [ "$(left_s)" -gt 45 ] || return 0
  timeout -k 5 $(($(left_s) - 15)) python3 -m mstar.cli bench serve --base-url http://127.0.0.1:8765 \
    --workload wan-480p-t2v --model wan2.2-ti2v-5b --concurrency 1 --num-requests 4 --num-warmup 0 \
    --poll-interval 0 -o "$out/serve-wan-hint.json" > "$out/serve-wan-hint.out" 2>&1
  echo "serve following the hint: exit $? at ${SECONDS}s"
}

zimage_c1() {  # zimage_c1 NUM_STEADY RESERVE_S: Z-Image 1024x1024 at c=1 only, its one size compiled
  suite_phase z-image-turbo zimage-1024 '["1024x1024"]' "$2" \
    --num-steady "$1" --num-high 0 --num-mixed 0 -- "${gpu_flags[@]}"
}

wan_video_timelines() {  # each Wan video's end, from the server's log (ms after arrival), kept and shown
  grep -h "ms after arrival" "$out/server-wan-480p-t2v.log" | tee "$out/video-timelines.txt"
}

wan_vae_gpu_test() {  # the Wan decode's GPU test: the compiled fast path against the plain decode
  MSTAR_VAE_CHUNK_FRAMES=1 guarded gpu-tests 150 python3 -m pytest -q -s -m gpu -p no:cacheprovider \
    tests/models/wan22/test_vae_gpu.py
  grep -E "fast bf16|plain|passed|failed" "$out/gpu-tests.out"
}

wan_vae_profile() {  # wan_vae_profile NAME LIMIT_S [VAE_PROFILE FLAG...]: the Wan decode's profile
  # (one latent frame a chunk, as served), then its median and top kernels
  local name=$1 limit=$2
  shift 2
  guarded "$name" "$limit" python3 -m mstar.bench.vae_profile --models wan --wan-chunks 1 "$@" \
    -o "$out/vae-profile.json"
  python3 -c "import json, sys; v = json.load(open(sys.argv[1]))['variants'][0]; print(v['median_ms'], v['by_kind_ms'])
for k in v['top_kernels'][:12]: print(round(k['ms_per_step'], 2), k['launches_per_step'], k['name'][:110])" "$out/vae-profile.json"
}

serve_phase() {  # serve_phase MODEL WORKLOAD COMPILE_SIZE CONCURRENCY NUM_REQUESTS [SERVER FLAG...]
  require "${SERVER_MODULES[@]}" av
  local model=$1 workload=$2 size=$3 concurrency=$4 num_requests=$5 log="$out/server-$2.log" started
  shift 5
  started=$(now_s)
  start_server "$model" "$log" "[\"$size\"]" "$@"
  wait_ready "$log" 300 "$started" || { stop_server; exit 4; }  # boot: random weights, warmup compile
  local steps_flag=()
  [ -n "${STEPS:-}" ] && steps_flag=(--steps "$STEPS")
  local workload_flag=(--workload "$workload")
  [ "$workload" = tiny-digits ] && workload_flag=(--kind image)  # its one size is the model's default
  mstar bench serve --base-url "http://127.0.0.1:8765" "${workload_flag[@]}" --model "$model" \
    --concurrency "${CONCURRENCY:-$concurrency}" --request-rate "${REQUEST_RATES:-}" \
    --num-requests "${NUM_REQUESTS:-$num_requests}" --num-warmup 1 "${steps_flag[@]}" -o "$out/serve-$workload.json"
  local status=$?
  stop_server
  return $status
}

gpu_flags=(--random-weights --device cuda --attention-backend "${ATTENTION_BACKENDS:-fa3}" --compile-mode deterministic)
case "$phase" in
  call1)
    missing "${SERVER_MODULES[@]}"  # said first: the serve phase at the end needs them
    guarded encode-speed 40 python3 bench/encode_speed.py  # the API's PNG and MP4 encodes, this host
    # Z-Image first: on 2026-11-29 the time guard cut the profile after Wan's two workloads
    guarded profile 270 python3 -m mstar.bench.profile --workloads zimage-1024-b1,wan-480p-cfg,wan-720p-b1 \
      --compile-modes deterministic --attention-backend fa3 -o "$out/profile.json"
    # TORCH_LOGS=recompiles: a recompile in these tests prints the guard that failed
    guarded gpu-tests 90 env TORCH_LOGS=recompiles python3 -m pytest -q -s -m gpu -p no:cacheprovider \
      -p no:logging tests/runtime/test_step_timer.py tests/models/zimage/test_text_graphs.py \
      tests/models/zimage/test_gpu_vae.py tests/models/wan22/test_dit_text_kv.py tests/models/test_compile_once_gpu.py
    zimage_suite ;;
  call3)  # carry .whl_pack: the API's PNG and MP4 encodes on this host, Z-Image's step profile with
    # inductor's generated code kept (xz) to read its fused kernels, then the Z-Image serving profile
    guarded encode-speed 60 python3 bench/encode_speed.py
    guarded profile 150 env TORCH_LOGS=output_code python3 -m mstar.bench.profile --workloads zimage-1024-b1 \
      --compile-modes deterministic --attention-backend fa3 -o "$out/profile.json"
    xz -T0 "$out/profile.out"
    zimage_suite ;;
  call7)  # carry .whl_pack: the kernels (triton_ops: inductor launches them): their GPU tests, then
    # both DiTs' step profiles with and without them on one machine, Z-Image at 1024 and 512 (host time)
    guarded gpu-tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_qk_norm_rotary.py \
      tests/engine/test_gated_residual_norm.py tests/engine/test_residual_layer_norm.py
    for kernels in 0 1; do
      guarded "profile-kernels-$kernels" 200 env MSTAR_TRITON_KERNELS=$kernels python3 -m mstar.bench.profile \
        --workloads zimage-1024-b1,zimage-512-b1,wan-480p-cfg --compile-modes deterministic \
        --attention-backend fa3 -o "$out/profile-kernels-$kernels.json"
    done ;;
  call9)  # carry .whl_pack: the Wan serving profile at the defaults (cold boot)
    wan_suite ;;
  call10)  # carry .whl_pack: Z-Image at 512x512, where host time may bound a step: kernels off, then on
    for kernels in false true; do
      export EXTRA_CONFIG="triton_kernels: $kernels"
      suite_phase z-image-turbo zimage-512 '["512x512"]' 20 \
        --num-steady 5 --high-concurrency 4 --num-high 8 --num-mixed 0 -- "${gpu_flags[@]}"
      for kind in json md out; do mv "$out/suite-zimage-512.$kind" "$out/suite-zimage-512-kernels-$kernels.$kind"; done
    done ;;
  call14)  # carry .whl_pack: Wan's and Z-Image 512's step profiles, kernels off and on, each with three
    # steps under cProfile and the host's CPU split: does the host wait, work, or do other threads take
    # the CPU while a step launches? (TORCH_LOGS=output_code in the environment keeps inductor's code.)
    for kernels in 0 1; do
      guarded "profile-cpu-kernels-$kernels" 190 env MSTAR_TRITON_KERNELS=$kernels python3 -m mstar.bench.profile \
        --workloads zimage-512-b1,wan-480p-cfg --compile-modes deterministic --attention-backend fa3 \
        --num-host-profiled 3 -o "$out/profile-cpu-kernels-$kernels.json"
    done ;;
  call15)  # carry .whl_pack: the Z-Image suite at the defaults (triton_kernels on since this call),
    # then a second fresh server (deterministic mode): its first image against the first server's
    zimage_suite
    for kind in json md out; do mv "$out/suite-zimage-1024.$kind" "$out/suite-zimage-1024-first.$kind"; done
    suite_phase z-image-turbo zimage-1024 '["1024x1024", "768x1024"]' 20 \
      --num-steady 1 --high-concurrency 8 --num-high 0 --num-mixed 0 -- "${gpu_flags[@]}"
    same_cold_output "two fresh servers, first image" "$out/suite-zimage-1024-first.json" \
      "$out/suite-zimage-1024.json" "$out/fresh-servers.txt" ;;
  call16)  # carry .whl_pack: Wan's DiT step at the defaults (the kernels on): both step targets
    our_step wan wan-480p-cfg,wan-720p-b1 400 ;;
  call17)  # carry .whl_pack: the MP4 encode by x264 thread count (whole and streamed), then Wan at
    # c=1 with each clip muxed whole once decoded (stream_video_frames false), then streamed to the
    # muxer chunk by chunk as the VAE decodes (the default); same requests, so the same MP4 bytes?
    guarded encode-speed 60 python3 bench/encode_speed.py
    guarded gpu-tests 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/models/wan22/test_vae_decode.py
    for stream in false true; do
      export EXTRA_CONFIG="stream_video_frames: $stream"
      wan_c1 8 20
      for kind in json md out; do mv "$out/suite-wan-480p-t2v.$kind" "$out/suite-wan-480p-t2v-stream-$stream.$kind"; done
      mv "$out/server-wan-480p-t2v.log" "$out/server-wan-480p-t2v-stream-$stream.log"
    done
    same_cold_output "muxed whole vs streamed, first video" "$out/suite-wan-480p-t2v-stream-false.json" \
      "$out/suite-wan-480p-t2v-stream-true.json" "$out/stream-parity.txt" ;;
  call18)  # carry .whl_pack: where a c=1 request's time goes (the suite's stage row from /metrics):
    # Z-Image 1024 (8 requests), then Wan 832x480x33 (4), each compiling its one size only
    zimage_c1 8 200
    wan_c1 4 20 ;;
  call19)  # carry .whl_pack: the encodes on this host, then Z-Image 1024 at c=1 with the stage row
    guarded encode-speed 60 python3 bench/encode_speed.py
    zimage_c1 8 20 ;;
  call20)  # carry .whl_pack: Wan's prompt encoder under CUDA graphs: its GPU test, then Wan at c=1
    guarded gpu-tests 45 python3 -m pytest -q -m gpu -p no:cacheprovider tests/models/wan22/test_text_graphs.py
    wan_c1 4 20 ;;
  call21)  # carry .whl_pack: where both VAE decodes' time goes, and their variants (Z-Image
    # channels-last; Wan 1, 2 and 4 latent frames a chunk)
    guarded vae-profile 400 python3 -m mstar.bench.vae_profile --models "${VAE_MODELS:-zimage,wan}" \
      -o "$out/vae-profile.json" ;;
  call22)  # carry .whl_pack (with uvloop, httptools): the Z-Image VAE's GPU test (the compiled decode,
    # norms by pixel blocks, against eager), the Z-Image suite, then a second fresh server's first image
    guarded gpu-tests 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/models/zimage/test_gpu_vae.py
    zimage_suite
    for kind in json md out; do mv "$out/suite-zimage-1024.$kind" "$out/suite-zimage-1024-first.$kind"; done
    zimage_c1 1 20
    same_cold_output "two fresh servers, first image" "$out/suite-zimage-1024-first.json" \
      "$out/suite-zimage-1024.json" "$out/fresh-servers.txt" ;;
  call23)  # carry .whl_pack (with uvloop, httptools): Wan 832x480x33 at c=1
    wan_c1 6 20 ;;
  call24)  # carry .whl_pack: Z-Image 1024 at c=1 on another machine (8 steady requests)
    zimage_c1 8 20 ;;
  call25)  # carry .whl_pack: the MP4 encodes (x264 settings) on this host; Wan 832x480x33 at c=1,
    # polled every 50 ms (the suite, with the media-ready stage), then following the server's poll hint
    guarded encode-speed 90 python3 bench/encode_speed.py
    KEEP_SERVER=1 wan_c1 5 60
    wan_c1_following_hint
    stop_server ;;
  call31)  # carry .whl_pack: Wan 832x480x33 at c=1 with status polls held until the job ends: polled
    # every 50 ms (the suite), then following the server's hint; each video's timeline from the log
    KEEP_SERVER=1 wan_c1 8 60
    wan_c1_following_hint
    stop_server
    wan_video_timelines ;;
  call26)  # carry .whl_pack: Wan 832x480x33 at c=1; each video's end from the server's log (the
    # runtime's outputs, the last frames written to the encoder, the MP4)
    wan_c1 6 20
    wan_video_timelines ;;
  call27)  # carry .whl_pack: which threads use the host's CPU while a Wan 832x480x33 request runs at
    # c=1 (bench/thread_cpu.py over the server and its workers), at the defaults, then on a second server
    # with OMP_NUM_THREADS=4 (torch's CPU threads in every process), each with its videos' timelines
    lscpu | grep -E "^(Model name|Thread|Core|Socket|CPU\(s\))" > "$out/cpu-threads.txt"
    for omp in default 4; do
      [ "$omp" = default ] || export OMP_NUM_THREADS=$omp
      KEEP_SERVER=1 wan_c1 2 45
      if [ -n "$server_pid" ] && [ "$(left_s)" -gt 40 ]; then
        python3 bench/thread_cpu.py "$server_pid" --duration 8 --interval 0.25 >> "$out/cpu-threads.txt" 2>&1 &
        sampler=$!
        echo "== OMP_NUM_THREADS $omp: one request, sampled" >> "$out/cpu-threads.txt"
        timeout -k 5 40 python3 -m mstar.cli bench serve --base-url http://127.0.0.1:8765 \
          --workload wan-480p-t2v --model wan2.2-ti2v-5b --concurrency 1 --num-requests 1 --num-warmup 0 \
          --poll-interval 0.05 -o "/tmp/serve-sampled.json" > /dev/null 2>&1
        wait "$sampler"
        { echo "== OMP_NUM_THREADS $omp: timelines"; grep -h "ms after arrival" "$out/server-wan-480p-t2v.log"
          grep -E "steady c=1 p50|c=1 ms a request" "$out/suite-wan-480p-t2v.md"; } >> "$out/cpu-threads.txt"
      fi
      stop_server
      mv "$out/server-wan-480p-t2v.log" "$out/server-wan-omp-$omp.log"
    done
    unset OMP_NUM_THREADS ;;
  call28)  # carry .whl_pack: the Wan decode's GPU test (the compiled fast path against the plain
    # decode), then its profile
    wan_vae_gpu_test
    wan_vae_profile vae-profile 150 ;;
  step-autotune)  # carry .whl_pack: Wan's guidance pair step, deterministic then max-autotune (inductor
    # times its GEMM templates against cuBLAS and may fuse epilogues into them); each its own process
    for mode in deterministic max-autotune; do
      started=$SECONDS
      guarded "step-$mode" 420 python3 -m mstar.cli bench step --workloads wan-480p-cfg --compile-modes "$mode" \
        --attention-backends fa3 --skip-diffusers --num-warmup 2 --num-timed 10 -o "$out/step-$mode.json"
      echo "$mode: $((SECONDS - started)) s in all"; grep -E "wan-480p-cfg" "$out/step-$mode.out" | tail -3
    done ;;
  call30)  # carry .whl_pack: x264's thread types and B-frames on this host (mp4 only); Wan 832x480x33
    # at c=1 with the decode's residual sums pinned channels-last
    guarded encode-speed 90 python3 bench/encode_speed.py --mp4-only
    cat "$out/encode-speed.out"
    wan_c1 6 20 ;;
  call29)  # carry .whl_pack: the Wan decode with its residual sums pinned channels-last: the GPU test
    # (compiled against plain), then the profile with inductor's generated code logged (xz)
    wan_vae_gpu_test
    TORCH_LOGS=output_code wan_vae_profile vae-code 200 --num-timed 5 --num-profiled 1
    xz -T0 "$out/vae-code.out" ;;
  vae-code)  # carry .whl_pack: the Wan decode's profile with inductor's generated code logged (xz)
    TORCH_LOGS=output_code wan_vae_profile vae-code 200 --num-timed 3 --num-profiled 1
    xz -T0 "$out/vae-code.out" ;;
  encodes)  # carry .whl_pack: the API's PNG and MP4 encodes on this host (bench/encode_speed.py)
    guarded encode-speed 200 python3 bench/encode_speed.py ${ENCODE_ARGS:-}
    cat "$out/encode-speed.out" ;;
  batch-scaling)  # carry .whl_pack: our DiT step alone and packed (deterministic, fa3), clocks beside it:
    # the per-request step time at c=N against c=1 bounds the c=N / c=1 throughput of the server
    sample_gpu_clocks
    our_step wan-scaling wan-480p-cfg,wan-480p-c4 300
    our_step zimage-scaling zimage-1024-b1,zimage-1024-c4,zimage-1024-c8 200
    stop_gpu_clocks
    grep -hE "^\| (wan|zimage)-" "$out"/step-*-scaling.out | head -20
    awk -F, '{print $1, $2}' "$out/gpu-clocks.txt" | uniq -c | tail -30 ;;
  gemm-sustained)  # nothing to carry: the Wan pair's GEMMs in bursts and back to back, clocks beside
    sample_gpu_clocks
    guarded gemm-sustained 120 python3 bench/gemm_sustained.py
    stop_gpu_clocks
    cat "$out/gemm-sustained.out"; awk -F, '{print $1, $2}' "$out/gpu-clocks.txt" | uniq -c | tail -40 ;;
  call4)  # carry .whl_pack: the Wan serving profile (cold boot), then Wan with offload_text_encoder
    # on the same machine (a warm compile cache): peak memory resident and offloaded
    wan_suite
    for kind in json md out; do mv "$out/suite-wan-480p-t2v.$kind" "$out/suite-wan-480p-t2v-resident.$kind"; done
    mv "$out/server-wan-480p-t2v.log" "$out/server-wan-480p-t2v-resident.log"
    export EXTRA_CONFIG="offload_text_encoder: true"
    suite_phase wan2.2-ti2v-5b wan-480p-t2v '["832x480x33", "480x832x33"]' 30 --sizes 832x480 \
      --num-steady 3 --num-high 0 --num-mixed 0 --poll-interval 0.05 -- "${gpu_flags[@]}"
    for kind in json md out; do mv "$out/suite-wan-480p-t2v.$kind" "$out/suite-wan-480p-t2v-offload.$kind"; done
    mv "$out/server-wan-480p-t2v.log" "$out/server-wan-480p-t2v-offload.log" ;;
  serve-zimage-eager)  # compile off (fast boot): each node's device and host time per step, a diagnostic
    suite_phase z-image-turbo zimage-1024 '["1024x1024"]' 20 \
      --num-steady 4 --high-concurrency 4 --num-high 4 --num-mixed 0 --company-sizes 768x1024 \
      -- --random-weights --device cuda --attention-backend fa3 --compile-mode off ;;
  diag-text)  # carry .whl_fa3 .whl_srv .whl_otel: the compile-once GPU tests, then where the prompt
    # step's host time goes: Qwen3 alone in a fresh process, then inside the server (compile off)
    guarded gpu-tests 120 env TORCH_LOGS=recompiles python3 -m pytest -q -s -m gpu -p no:cacheprovider \
      -p no:logging tests/models/test_compile_once_gpu.py
    guarded text-encoder-alone 100 python3 bench/text_encoder_profile.py
    export MSTAR_PROFILE_NODES=text_encoder MSTAR_PROFILE_DIR="$out/profiles"
    suite_phase z-image-turbo zimage-1024 '["1024x1024"]' 20 \
      --num-steady 4 --high-concurrency 4 --num-high 4 --num-mixed 0 --company-sizes 768x1024 \
      -- --random-weights --device cuda --attention-backend fa3 --compile-mode off ;;
  probe-repeat)  # carry .whl_pack: Wan's cold request vs its repeat, hashed at every node and step
    # (MSTAR_TRACE_TENSORS), eager first (a fast boot), then compiled as served
    for mode in off deterministic; do
      export MSTAR_TRACE_TENSORS="$out/trace-$mode"
      suite_phase wan2.2-ti2v-5b wan-480p-t2v '["832x480x33", "480x832x33"]' 30 --sizes 832x480 \
        --num-steady 2 --num-high 0 --num-mixed 0 --poll-interval 0.05 \
        -- --random-weights --device cuda --attention-backend fa3 --compile-mode "$mode"
      mv "$out/suite-wan-480p-t2v.json" "$out/probe-$mode.json"
      mv "$out/server-wan-480p-t2v.log" "$out/probe-$mode-server.log"
      python3 -m mstar.runtime.tensor_trace "$out/trace-$mode" | tee "$out/probe-$mode.txt"
    done
    unset MSTAR_TRACE_TENSORS ;;
  serve-zimage-suite)  # the serving part of call1 alone
    zimage_suite ;;
  call2)
    suite_phase wan2.2-ti2v-5b wan-480p-t2v '["832x480x33", "480x832x33"]' 60 \
      --sizes 832x480,480x832 --num-steady 3 --high-concurrency 4 --num-high 8 --num-mixed 8 \
      --poll-interval 0.05 -- "${gpu_flags[@]}"
    guarded gpu-tests 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_offload.py \
      tests/models/wan22/test_text_offload.py tests/models/wan22/test_dit_text_kv.py
    # two fresh `mstar serve` processes on CUDA (compiled, deterministic): the same PNG bytes
    guarded determinism 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/serving/test_determinism.py ;;
  confirm)  # carry .whl_pack: Wan's first video against its repeats after the MP4 fix (one compile
    # size: a shorter boot)
    suite_phase wan2.2-ti2v-5b wan-480p-t2v '["832x480x33"]' 30 --sizes 832x480 \
      --num-steady 3 --num-high 0 --num-mixed 0 --poll-interval 0.05 -- "${gpu_flags[@]}" ;;
  serve-wan-offload)  # carry .whl_pack; right after call2 on the same machine (its compiled kernels
    # are cached, so the boot is no cold boot): the Wan server with UMT5 streamed from host memory
    export EXTRA_CONFIG="offload_text_encoder: true"
    suite_phase wan2.2-ti2v-5b wan-480p-t2v '["832x480x33", "480x832x33"]' 30 --sizes 832x480 \
      --num-steady 4 --num-high 0 --num-mixed 0 --poll-interval 0.05 -- "${gpu_flags[@]}"
    mv "$out/suite-wan-480p-t2v.json" "$out/suite-wan-480p-t2v-offload.json" ;;
  baseline)  # carry .whl_ref .whl_srv .whl_otel; WHEEL_DIRS=".whl_ref .whl_srv .whl_otel"; CALL_BUDGET_S=560
    require diffusers
    # two fresh `mstar serve` processes on CUDA (compiled, deterministic): the same PNG bytes
    guarded determinism 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/serving/test_determinism.py
    # one workload per process, each under the call's deadline: a late stop keeps what ended before it
    guarded diffusers-zimage 200 python3 -m mstar.cli bench diffusers --workloads zimage-1024 \
      --modes "${DIFFUSERS_MODES:-eager,compiled}" --num-warmup 1 --num-timed 3 -o "$out/diffusers-zimage.json"
    guarded diffusers-wan 330 python3 -m mstar.cli bench diffusers --workloads wan-480p-t2v \
      --modes "${DIFFUSERS_MODES:-eager,compiled}" --num-warmup 1 --num-timed 3 -o "$out/diffusers-wan.json" ;;
  baseline-720p)
    require diffusers
    mstar bench diffusers --workloads wan-720p-t2v --modes eager --num-warmup 1 --num-timed 1 \
      -o "$out/diffusers-720p.json" ;;
  profile)  # where the time goes: DiT kernels by kind (two compile modes), Z-Image's stages outside it
    guarded profile-deterministic 270 python3 -m mstar.bench.profile --gemms --workloads wan-480p-cfg,zimage-1024-b1 \
      --compile-modes deterministic --attention-backend fa3 -o "$out/profile-deterministic.json"
    guarded stages 120 python3 -m mstar.bench.stages -o "$out/stages.json"
    guarded profile-default 240 python3 -m mstar.bench.profile --workloads wan-480p-cfg,zimage-1024-b1 \
      --compile-modes default --attention-backend fa3 -o "$out/profile-default.json" ;;
  step-wan) step_phase wan wan-480p-b1,wan-480p-cfg,wan-480p-c4,wan-720p-b1 ;;
  step-zimage) step_phase zimage zimage-1024-b1,zimage-1024-c4 ;;
  flux2)  # FLUX.2 [klein] 4B at 1024x1024, the pipeline's default 50 steps, random weights, ~8 min;
    # WHEEL_DIRS=".whl_ref .whl_srv .whl_otel" (diffusers, the server's deps), CALL_BUDGET_S=560.
    # The DiT step ours (deterministic, fa3) against diffusers eager and compiled; then the server:
    # cold request and steady c=1 (p50, peak GiB), c=8 (16 requests), c=4 (8), an edit with two
    # 1024x1024 references at c=1 (cold, then 3 steady)
    require diffusers
    guarded step-flux2 210 python3 -m mstar.cli bench step --workloads flux2-1024-b1 \
      --compile-modes deterministic --attention-backends "${ATTENTION_BACKENDS:-fa3}" \
      --diffusers-modes eager,compiled --num-warmup 2 --num-timed 5 -o "$out/step-flux2.json"
    KEEP_SERVER=1 suite_phase flux2-klein-4b flux2-1024 '["1024x1024"]' 90 \
      --num-steady 3 --high-concurrency 8 --num-high 16 --num-mixed 0 -- "${gpu_flags[@]}"
    if [ -n "$server_pid" ]; then
      guarded serve-flux2-c4 60 python3 -m mstar.cli bench serve --base-url http://127.0.0.1:8765 \
        --workload flux2-1024 --model flux2-klein-4b --concurrency 4 --num-requests 8 --num-warmup 0 \
        -o "$out/serve-flux2-c4.json"
      guarded edit-flux2 60 python3 bench/edit_latency.py --model flux2-klein-4b --num-references 2 \
        --size 1024x1024 --num-steady 3 -o "$out/edit-flux2.json"
      cat "$out/edit-flux2.out"
    fi
    stop_server ;;
  # the DiT step targets side by side with diffusers eager and compiled, one family a call:
  # WHEEL_DIRS=.whl_ref COMPILE_MODES=deterministic DIFFUSERS_MODES=eager,compiled (carry .whl_ref)
  step-wan-targets) step_phase wan wan-480p-cfg,wan-720p-b1 ;;
  step-zimage-targets) step_phase zimage zimage-1024-b1 ;;
  serve-wan) serve_phase wan2.2-ti2v-5b wan-480p-t2v 832x480x33 1,2,4 4 "${gpu_flags[@]}" ;;
  serve-zimage) serve_phase z-image-turbo zimage-1024 1024x1024 1,4,8 8 "${gpu_flags[@]}" ;;
  serve-tiny)  # CPU check of this script's plumbing: the suite (a size list of one), then the classic serve
    suite_phase tiny-digits tiny-digits '["256x256"]' 10 --kind image --size 256x256 --sizes 256x256 \
      --steps 4 --num-steady 2 --high-concurrency 2 --num-high 2 --num-mixed 2 --company-sizes 256x256 \
      -- --device cpu && serve_phase tiny-digits tiny-digits 256x256 1,2 4 --device cpu ;;
  *) echo "unknown phase '$phase'" >&2; exit 2 ;;
esac
status=$?
echo "== $phase: exit $status, ${SECONDS}s; results in $out"
echo
mstar bench table "$out"
# The device tool brings back at most 8 files: beyond that, the server logs and the tables (printed
# above) go into one archive so that every result JSON comes back.
if [ "$(find "$out" -type f | wc -l)" -gt 8 ]; then
  (cd "$out" && tar cf - ./*.log ./*.md 2> /dev/null | xz -T0 > logs-and-tables.tar.xz && rm -f ./*.log ./*.md)
fi
exit $status
