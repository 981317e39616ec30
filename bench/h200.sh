#!/usr/bin/env bash
# mstar against diffusers on one GPU, in named phases; run from the project root.
#
#   bash bench/h200.sh baseline [wan|zimage]  diffusers' pipelines end to end, eager and compiled   ~7 min
#   bash bench/h200.sh step MODEL             our DiT step against diffusers' DiT, eager and
#                                             compiled, same weights: ms, roofline, PSNR  ~8 / ~4 min
#   bash bench/h200.sh serve MODEL            our server end to end (random weights): c=1 p50,
#                                             per minute at c=N, peak GiB, the first request at a
#                                             size not compiled at warmup against its steady one,
#                                             recompiles in traffic                       ~8 / ~5 min
#   bash bench/h200.sh parity MODEL           our nodes against the pipeline on one folder it wrote
#                                             (random weights): frames PSNR before any encoding   ~5 min
#   bash bench/h200.sh test MODEL             the model's gpu-marked tests (cosmos3, cosmos3-folder)
#   bash bench/h200.sh lora FAMILY            four requests with four rank-32 adapters: diffusers one
#                                             adapter at a time (fused), then ours packed (wan2.2,
#                                             z-image or flux2-klein; `wheels test`)       ~6 min wan
#   bash bench/h200.sh all                    every phase above for wan and zimage, one after another
#   bash bench/h200_flux2.sh                  FLUX.2 in one call: first t2i and first edit against
#                                             steady, c=1 against diffusers eager, step against compiled
# MODEL: wan, zimage, flux2, ltx2, cosmos3; times above are wan / zimage. Cosmos3-Edge's cells, one
# call each (832x480x121 and 1280x704x121, 20 steps, guidance 6):
#   baseline cosmos3 | cosmos3-720p   Cosmos3OmniPipeline eager and compiled                ~5 / ~7 min
#   step cosmos3 | cosmos3-720p       the generation step against Cosmos3OmniTransformer    ~5 / ~6 min
#   serve cosmos3                     cold vs steady, c=1, c=4, 480x832 first vs steady     ~7 min
#   serve cosmos3-mixed               a fresh server (both sizes compiled at boot): 832x480
#                                     and 480x832 interleaved at c=4 (p99/p50, recompiles),
#                                     then c=2 closed loop                                  ~7 min
#   serve cosmos3-720p                1280x704x121: cold vs steady, c=1, c=2, c=4           ~7 min
#   parity cosmos3                    cosmos3-edge t2v (1 and 20 steps) then cosmos3-nano
#                                     t2v (1 and 2 steps), each with its generation-pathway
#                                     rows held to 2e-2 (exit 1 when over)                  ~7 min
#   test cosmos3 | cosmos3-folder     tests/models/cosmos3/test_gpu.py (Edge and Nano against
#                                     diffusers, compile once) | a save_pretrained folder
#                                     served with --model-path                              ~5 / ~4 min
# (`wheels test` packs what the test phase needs: diffusers, fa3-fwd, PyAV and the server's deps)
# LTX-2 at its pipeline's default 768x512x121 and at 1280x704x121, each row one call:
#   baseline ltx2 | ltx2-704p | ltx2-regional        LTX2Pipeline eager, then regionally compiled
#                                                    (two JSONs) | eager | regionally compiled
#   step ltx2 | step ltx2-704p                       the guided step (cond, uncond, isolated passes)
#                                                    against diffusers eager (DIFFUSERS_MODES to change)
#   serve ltx2                                       first against steady, c=1 p50, c=2, a new size
#   serve ltx2-c4                                    first against steady, c=4 (one wave of 4)
#   serve ltx2-704p                                  1280x704: first against steady, c=1 p50
#   serve ltx2-704p-c24                              1280x704: one wave of 2, then one of 4 (closed
#                                                    loops, no cold request first)
# then, where the results came back:
#   mstar bench report bench-results/bench    (rewrites docs/benchmarks.md's tables from the JSON)
#
# Results go to $OUT/bench (default ./bench-results/bench): one JSON and one table per benchmark;
# the tables are printed last. Each phase stops what it runs after CALL_BUDGET_S seconds (560) and
# keeps what was measured, so one phase fits a 10-minute call on a rented GPU.
#
# Needs: a CUDA build of torch with `pip install -e ".[models,gpu]"` for `step` and `serve`, and
# diffusers (`pip install diffusers`) for `baseline` and `step`. A GPU machine without network takes
# them as wheels: on a machine with network, `bash bench/h200.sh wheels baseline|step|serve|llm`
# downloads that phase's wheels for Python $WHEEL_PYTHON (3.12) and packs them into
# .whl_pack/site.tar.xz (unpacked and xz-compressed: 30-40 MB, so the tree and the pack stay under
# a 64 MiB upload); bring .whl_pack/ along and the phase installs it into /tmp/site first. diffusers
# and our server are never needed in the same phase, so `baseline` and `serve` take separate packs.
#
# Knobs (environment): CALL_BUDGET_S, DIFFUSERS_MODES (`step`), ATTENTION_BACKEND (fa3; flashinfer
# or torch elsewhere than Hopper), LORA_PROFILE (`lora`: 1 profiles both steps), PYTHON (python3),
# OUT, WHEEL_PYTHON.
set -uo pipefail

PYTHON=${PYTHON:-python3}
phase=${1:?usage: bash bench/h200.sh baseline|step|parity|serve|test|lora|all [MODEL] | wheels PHASE}
model=${2:-}

server_deps() {  # the server's pure-Python requirements, pinned as this machine's environment has them
  "$PYTHON" -m pip freeze | grep -iE '^(fastapi|starlette|uvicorn|uvloop|httptools|h11|msgspec|pyzmq|python-multipart|prometheus.client|pydantic|pydantic.core|annotated-types|typing-inspection|anyio|sniffio|httpx|httpcore|typing.extensions|idna|certifi|click|opentelemetry.api|annotated.doc)=='
}

if [ "$phase" = wheels ]; then
  case "${model:?wheels baseline|step|parity|serve|test|llm}" in
    baseline) reqs=(diffusers==0.42.1 importlib_metadata) ;;
    step | parity) reqs=(diffusers==0.42.1 importlib_metadata fa3-fwd==0.0.3) ;;
    serve) reqs=(fa3-fwd==0.0.3 av==19.0.2) ;;
    # a server and diffusers; peft for diffusers' own LoRA loading (python -m mstar.bench.lora_diffusers)
    test) reqs=(diffusers==0.42.1 importlib_metadata fa3-fwd==0.0.3 av==19.0.2 peft==0.21.2) ;;
    llm) reqs=(flashinfer-python==0.7.2.post1 "apache-tvm-ffi>=0.1.11,<0.2") ;;  # bench/h200_llm.sh
    *) echo "wheels: baseline, step, parity, serve, test or llm" >&2; exit 2 ;;
  esac
  mapfile -t pinned < <(server_deps)
  download=$(mktemp -d) staging=$(mktemp -d)
  # fa3-fwd's wheels are tagged manylinux_2_24 only
  platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64)
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "${WHEEL_PYTHON:-3.12}" \
    --implementation cp "${platforms[@]}" -d "$download" "${reqs[@]}" "${pinned[@]}" || exit 1
  for wheel in "$download"/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$staging/"; done
  mkdir -p .whl_pack && tar cf - -C "$staging" . | xz -T0 -6 > .whl_pack/site.tar.xz
  rm -rf "$download" "$staging"
  ls -la .whl_pack
  exit 0
fi

out="${OUT:-$PWD/bench-results}/bench"
mkdir -p "$out"
source "$(dirname "$0")/lib.sh"  # unpack_wheels, guarded, ready, stop_server
unpack_wheels || exit 1  # every wheel pack brought along (see `wheels` above)
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2> /dev/null || true
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

bench() { "$PYTHON" -m mstar.cli bench "$@"; }
start_budget() { deadline=$((SECONDS + ${CALL_BUDGET_S:-560})); }

require() {  # require MODULE...: stop with the list of what this machine lacks
  "$PYTHON" - "$@" <<'EOF' || exit 3
import importlib.util, sys
missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing on this machine: {' '.join(missing)} (see the top of bench/h200.sh)")
EOF
}

attention_module() {  # the Python module ATTENTION_BACKEND needs (none for torch)
  case "${ATTENTION_BACKEND:-fa3}" in fa3) echo fa3_fwd_interface ;; flashinfer) echo flashinfer ;; esac
}

baseline() {  # diffusers' pipelines end to end (random weights of the real configs), eager and compiled
  require diffusers
  start_budget
  case "${1:-}" in
    cosmos3 | cosmos3-720p)  # Cosmos3OmniPipeline (no text encoder: the prompt's tokens go into the DiT)
      local workload=cosmos3-480p-t2v timed=3
      [ "$1" = cosmos3-720p ] && workload=cosmos3-720p-t2v timed=2
      guarded "diffusers-$1" "$(left_s)" "$PYTHON" -m mstar.cli bench diffusers --workloads "$workload" \
        --modes eager,compiled --num-warmup 1 --num-timed "$timed" -o "$out/diffusers-$1.json"
      return 0 ;;
    ltx2)  # LTX2Pipeline 768x512x121, 30 steps (4 DiT passes a step): eager, then compiled, each its
      # own JSON (~50 s a video). Compiled is diffusers' regional compile (each of the 48 blocks one
      # compiled graph): the whole-model compile of the unrolled blocks runs past a 10-minute call.
      guarded diffusers-ltx2-eager 240 "$PYTHON" -m mstar.cli bench diffusers --workloads ltx2-512p-t2v \
        --modes eager --num-warmup 1 --num-timed 2 -o "$out/diffusers-ltx2-eager.json"
      guarded diffusers-ltx2-regional "$(left_s)" "$PYTHON" -m mstar.cli bench diffusers \
        --workloads ltx2-512p-t2v --modes regional --num-warmup 1 --num-timed 1 -o "$out/diffusers-ltx2-regional.json"
      return 0 ;;
    ltx2-regional)  # the regional compile alone (the eager figures measured before)
      guarded diffusers-ltx2-regional "$(left_s)" "$PYTHON" -m mstar.cli bench diffusers \
        --workloads ltx2-512p-t2v --modes regional --num-warmup 1 --num-timed 2 -o "$out/diffusers-ltx2-regional.json"
      return 0 ;;
    ltx2-704p)  # 1280x704x121: about 2 min a video eager, so eager alone fits a call
      guarded diffusers-ltx2-704p "$(left_s)" "$PYTHON" -m mstar.cli bench diffusers --workloads ltx2-704p-t2v \
        --modes eager --num-warmup 1 --num-timed 1 -o "$out/diffusers-ltx2-704p.json"
      return 0 ;;
  esac
  [ "${1:-zimage}" != wan ] && guarded diffusers-zimage 200 "$PYTHON" -m mstar.cli bench diffusers \
    --workloads zimage-1024 --modes eager,compiled --num-warmup 1 --num-timed 3 -o "$out/diffusers-zimage.json"
  [ "${1:-wan}" != zimage ] && guarded diffusers-wan 340 "$PYTHON" -m mstar.cli bench diffusers \
    --workloads wan-480p-t2v --modes eager,compiled --num-warmup 1 --num-timed 3 -o "$out/diffusers-wan.json"
  return 0
}

step() {  # step wan|zimage: our DiT (deterministic) against diffusers' eager and compiled, same weights
  require diffusers $(attention_module)
  local workloads modes=eager,compiled
  case "$1" in
    wan) workloads=wan-480p-cfg,wan-720p-b1 ;;
    zimage) workloads=zimage-1024-b1 ;;
    flux2) workloads=flux2-1024-b1 ;;
    # diffusers' compile of the 48-block transformer (unrolled) would take the call: eager here, the
    # compiled pipeline in `baseline ltx2`
    ltx2) workloads=ltx2-512p-guided modes=eager ;;
    ltx2-704p) workloads=ltx2-704p-guided modes=eager ;;
    cosmos3) workloads=cosmos3-480p-cfg ;;
    cosmos3-720p) workloads=cosmos3-720p-cfg ;;
    *) echo "step: wan, zimage, flux2, ltx2, ltx2-704p, cosmos3 or cosmos3-720p" >&2; return 2 ;;
  esac
  start_budget
  guarded "step-$1" "$(left_s)" "$PYTHON" -m mstar.cli bench step --workloads "$workloads" \
    --compile-modes deterministic --attention-backends "${ATTENTION_BACKEND:-fa3}" \
    --diffusers-modes "${DIFFUSERS_MODES:-$modes}" --num-warmup 3 --num-timed 10 -o "$out/step-$1.json"
}

parity() {  # parity wan|zimage: the pipeline's folder (real config, random weights) and our nodes on it
  require diffusers accelerate
  local served
  case "$1" in
    wan) served=wan2.2-ti2v-5b ;;
    zimage) served=z-image-turbo ;;
    flux2) served=flux2-klein-4b ;;
    ltx2) served=ltx-2 ;;
    cosmos3) served=cosmos3-edge ;;
    *) echo "parity: wan, zimage, flux2, ltx2 or cosmos3" >&2; return 2 ;;
  esac
  start_budget
  if [ "$1" = cosmos3 ]; then  # Edge, then Nano (14.6B parameters: a 29 GB folder, 1- and 2-step cases)
    guarded parity-cosmos3-edge $(($(left_s) * 3 / 5)) "$PYTHON" -m mstar.cli bench parity cosmos3-edge \
      --device cuda -o "$out/parity-cosmos3-edge.json"
    guarded parity-cosmos3-nano "$(left_s)" "$PYTHON" -m mstar.cli bench parity cosmos3-nano \
      --device cuda -o "$out/parity-cosmos3-nano.json"
    return 0
  fi
  guarded "parity-$1" "$(left_s)" "$PYTHON" -m mstar.cli bench parity "$served" --device cuda \
    -o "$out/parity-$1.json"
}

gpu_tests() {  # gpu_tests cosmos3|cosmos3-folder: the model's gpu-marked tests, one call
  require diffusers pytest
  local tests
  case "$1" in
    cosmos3) tests=(tests/models/cosmos3/test_gpu.py tests/engine/test_prefix_attention_gpu.py) ;;
    cosmos3-folder) require av fastapi uvicorn; tests=(tests/models/cosmos3/test_served_folder_gpu.py) ;;
    *) echo "test: cosmos3 or cosmos3-folder" >&2; return 2 ;;
  esac
  start_budget
  guarded "test-$1" "$(left_s)" "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rs \
    "${tests[@]}"
  tail -15 "$out/test-$1.out"
}

serve() {  # serve wan|zimage: our server with random weights, one size compiled, then the suite
  local name=$1 served workload compile_size suite_args closed_loop=() after_suite=() after_s=0 suite_name=""
  local device_flags=(--random-weights --device cuda --attention-backend "${ATTENTION_BACKEND:-fa3}")
  case "$name" in
    tiny)  # a CPU check of this phase's plumbing with the embedded model
      served=tiny-digits workload=tiny-digits compile_size=256x256 device_flags=(--device cpu)
      suite_args=(--kind image --size 256x256 --sizes 256x256 --steps 4 --num-steady 2 --high-concurrency 2
        --num-high 2 --num-mixed 2 --new-size 256x256 --new-size-settle 1) ;;
    wan)
      served=wan2.2-ti2v-5b workload=wan-480p-t2v compile_size=832x480x33
      suite_args=(--sizes 832x480,480x832 --num-steady 3 --high-concurrency 4 --num-high 8 --num-mixed 8
        --poll-interval 0.05 --new-size 480x832 --new-size-settle 60) ;;
    zimage)
      served=z-image-turbo workload=zimage-1024 compile_size=1024x1024
      suite_args=(--num-steady 5 --high-concurrency 8 --num-high 16 --num-mixed 0
        --company-sizes 768x1024,768x1024 --new-size 768x1344 --new-size-settle 30) ;;
    flux2)
      served=flux2-klein-4b workload=flux2-1024 compile_size=1024x1024
      suite_args=(--num-steady 3 --high-concurrency 8 --num-high 16 --num-mixed 0 --new-size 768x1344
        --new-size-settle 30) ;;
    ltx2)
      served=ltx-2 workload=ltx2-512p-t2v compile_size=768x512x121
      suite_args=(--num-steady 2 --high-concurrency 2 --num-high 4 --num-mixed 0 --new-size 512x768
        --new-size-settle 60) ;;
    ltx2-c4)
      served=ltx-2 workload=ltx2-512p-t2v compile_size=768x512x121
      suite_args=(--num-steady 1 --high-concurrency 4 --num-high 4 --num-mixed 0) ;;
    ltx2-704p)  # about 1.3 min a video: first against steady and c=1 take the call
      served=ltx-2 workload=ltx2-704p-t2v compile_size=1280x704x121
      suite_args=(--num-steady 2 --high-concurrency 2 --num-high 2 --num-mixed 0) ;;
    ltx2-704p-c24)  # one wave of 2, then one of 4 (closed loops: no cold request first, which
      # would not leave room)
      served=ltx-2 workload=ltx2-704p-t2v compile_size=1280x704x121
      closed_loop=(--concurrency 2 --num-requests 2 --num-warmup 0)
      after_suite=(--concurrency 4 --num-requests 4) after_s=315 ;;
    cosmos3)  # the write-ups' cell: c=1, c=4, and a size the warmup did not compile
      served=cosmos3-edge workload=cosmos3-480p-t2v compile_size=832x480x121
      suite_args=(--num-steady 3 --high-concurrency 4 --num-high 8 --num-mixed 0 --new-size 480x832
        --new-size-settle 60) ;;
    cosmos3-mixed)  # a fresh server: the two orientations interleaved at c=4 first, then c=2 (after)
      served=cosmos3-edge workload=cosmos3-480p-t2v compile_size=832x480x121,480x832x121
      after_suite=(--concurrency 2 --num-requests 4) after_s=75
      suite_name=cosmos3-480p-mixed  # its own name (results pick the steady figures by workload)
      suite_args=(--kind video --steps 20 --guidance-scale 6.0 --extra-body '{"num_frames": 121}'
        --sizes 832x480,480x832 --num-steady 0 --high-concurrency 4 --num-high 0 --num-mixed 8) ;;
    cosmos3-720p)  # about 16 s a video by its FLOPs: cold, c=1 and c=2 in the suite, then one wave of 4
      served=cosmos3-edge workload=cosmos3-720p-t2v compile_size=1280x704x121
      after_suite=(--concurrency 4 --num-requests 4) after_s=100
      suite_args=(--num-steady 2 --high-concurrency 2 --num-high 4 --num-mixed 0) ;;
    *) echo "serve: wan, zimage, flux2, ltx2[-c4], ltx2-704p[-c24], cosmos3[-mixed|-720p] (or tiny, on the CPU)" >&2
      return 2 ;;
  esac
  if [ "$name" = tiny ]; then require fastapi uvicorn msgspec zmq; else require fastapi uvicorn msgspec zmq av $(attention_module); fi
  start_budget
  local log="$out/server-$name.log" started=$SECONDS
  setsid "$PYTHON" -m mstar.cli serve "$served" "${device_flags[@]}" --port 8765 \
    --compile-sizes "$compile_size" > "$log" 2>&1 &
  server_pid=$!
  until ready http://127.0.0.1:8765/ready; do
    if ! kill -0 "$server_pid" 2> /dev/null || [ "$(left_s)" -lt 60 ]; then
      echo "serve $name: the server did not get ready; its last lines:"; tr '\r' '\n' < "$log" | tail -30
      stop_server; return 4
    fi
    sleep 1
  done
  local boot_s=$((SECONDS - started))
  echo "serve $name: ready after ${boot_s}s"
  if [ ${#closed_loop[@]} -gt 0 ]; then  # closed-loop runs only, no suite
    guarded "serve-$name" $(($(left_s) - 15 - after_s)) "$PYTHON" -m mstar.cli bench serve \
      --base-url http://127.0.0.1:8765 --workload "$workload" --model "$served" "${closed_loop[@]}" \
      -o "$out/serve-$name.json"
  else
    guarded "suite-$name" $(($(left_s) - 15 - after_s)) "$PYTHON" -m mstar.cli bench serve-suite \
      --base-url http://127.0.0.1:8765 --workload "${suite_name:-$workload}" --model "$served" \
      --boot-s "$boot_s" --max-duration $(($(left_s) - 30 - after_s)) "${suite_args[@]}" \
      -o "$out/suite-$name.json"
  fi
  if [ ${#after_suite[@]} -gt 0 ]; then  # after the suite, a closed loop at another concurrency
    guarded "serve-$name" $(($(left_s) - 15)) "$PYTHON" -m mstar.cli bench serve \
      --base-url http://127.0.0.1:8765 --workload "$workload" --model "$served" --num-warmup 0 \
      "${after_suite[@]}" -o "$out/serve-$name${closed_loop:+-after}.json"
  fi
  echo "recompile warnings in the server log: $(grep -c 'recompiled in traffic' "$log")"
  grep -h "swapped in\|stays eager" "$log" | tail -4
  stop_server
}

lora() {  # lora wan2.2|z-image|flux2-klein: four requests with four adapters: diffusers one adapter
  # at a time, fused (about a minute, first, so a call cut short keeps it), then ours packed on the
  # LoRA paths the server takes
  require diffusers peft $(attention_module)
  start_budget
  guarded "lora-diffusers-$1" 200 "$PYTHON" -u -m mstar.bench.lora_diffusers --family "$1"
  guarded "lora-step-$1" "$(left_s)" "$PYTHON" -u -m mstar.bench.lora_step --family "$1" \
    ${LORA_PROFILE:+--profile}  # the server's paths; LORA_PROFILE=1: where the extra time goes
  cat "$out/lora-diffusers-$1.out" "$out/lora-step-$1.out" | grep -E " ms|torch |launches" || true
}

case "$phase" in
  baseline) baseline "$model" ;;
  lora) lora "${model:?lora wan2.2|z-image|flux2-klein}" ;;
  step) step "${model:?step wan|zimage}" ;;
  serve) serve "${model:?serve wan|zimage}" ;;
  parity) parity "${model:?parity wan|zimage}" ;;
  test) gpu_tests "${model:?test cosmos3|cosmos3-folder}" ;;
  all) baseline && step wan && step zimage && parity wan && parity zimage && serve wan && serve zimage ;;
  *) echo "unknown phase '$phase'" >&2; exit 2 ;;
esac
status=$?
echo "== $phase ${model}: exit $status, ${SECONDS}s; results in $out"
bench table "$out"
exit $status
