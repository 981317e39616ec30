#!/usr/bin/env bash
# LLM serving on the H200: the GPU tests, then `mstar bench llm` for Qwen3-0.6B and Qwen3-8B
# (random weights, bf16) against transformers' batched generate. Each phase is one device call
# (< 10 min), run from the project root; results go to $OUT/bench/<phase>.json and .md.
#
# Prepare locally once (FlashInfer + apache-tvm-ffi and the server's pure-Python deps, unpacked and
# xz-compressed into .whl_pack/ so they fit a 64 MiB upload):
#   bash bench/h200.sh wheels llm
# Device calls, in this order on one warm machine (carry .whl_pack each time; the first builds
# FlashInfer's kernels, 25-95 s, into /tmp/mstar-cache/flashinfer, which later calls reuse):
#   bash bench/h200_llm.sh llm-test     the gpu-marked KV/attention and Qwen3 parity tests, and
#                                       the ragged and prefix (Cosmos3) attention on FlashInfer  ~5 min
#   bash bench/h200_llm.sh llm-0.6b     mstar bench llm --model qwen3-0.6b                   ~4 min
#   bash bench/h200_llm.sh llm-8b       mstar bench llm --model qwen3-8b                     ~7 min
#   bash bench/h200_llm.sh llm-profile  Qwen3-8B's c=1 decode step: its kernels and host parts  ~3 min
# Knobs (environment): CONCURRENCY (1,8,32,128), KV_BACKEND (auto | flashinfer | fa3 | torch),
# EXTRA (more `mstar bench llm` flags, e.g. "--no-cuda-graphs --skip-baseline"),
# MSTAR_LOG_LEVEL=DEBUG (the server logs each text request's stages; the prefix-cache phase's print).
set -uo pipefail

phase="${1:?usage: bash bench/h200_llm.sh llm-test|llm-0.6b|llm-8b|llm-profile}"
out="${OUT:-$PWD/bench-results}/bench"
mkdir -p "$out"
source "$(dirname "$0")/lib.sh"  # unpack_wheels, guarded, ready, stop_server
unpack_wheels || exit 1
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
export FLASHINFER_WORKSPACE_BASE=/tmp/mstar-cache/flashinfer
python3 -c "import flashinfer, fastapi, msgspec, zmq" || { echo "bring .whl_pack (see the header)" >&2; exit 1; }

bench_llm() {  # bench_llm MODEL: the serving benchmark and the baseline, one table at the end
  timeout 560 python3 -m mstar.cli bench llm --model "$1" --concurrency "${CONCURRENCY:-1,8,32,128}" \
    --kv-attention-backend "${KV_BACKEND:-auto}" --compile-cache-dir /tmp/mstar-cache \
    -o "$out/llm-$1.json" ${EXTRA:-} 2> "$out/llm-$1.log"
  status=$?
  grep -E "KV pool|paged attention|captured|boot:|fused|compiled" "$out/llm-$1.log" | sed 's/^/  log: /'
  # with MSTAR_LOG_LEVEL=DEBUG: the prefix-cache phase's five (miss, hit) pairs, stage by stage
  grep "ms after arrival" "$out/llm-$1.log" | tail -10 | sed 's/^.*: ms after arrival: /  timeline: /'
  [ -e "$out/llm-$1.md" ] && cat "$out/llm-$1.md"
  return $status
}

case "$phase" in
  llm-test)
    nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
    timeout 560 python3 -m pytest -q -s -p no:cacheprovider -m gpu -o addopts="" \
      tests/engine/test_kv_gpu.py tests/models/qwen3/test_qwen3_gpu.py \
      tests/engine/test_attention_gpu.py tests/engine/test_prefix_attention_gpu.py 2>&1 | tail -25
    ;;
  llm-profile)  # where a Qwen3-8B c=1 decode step's device and host time go (its top kernels)
    timeout 560 python3 -m mstar.bench.llm_step_profile --model qwen3-8b --rows 1 --num-steps 50 \
      -o "$out/llm-step-profile-8b.json" 2>&1 | tail -60
    ;;
  llm-0.6b) bench_llm qwen3-0.6b ;;
  llm-8b) bench_llm qwen3-8b ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
