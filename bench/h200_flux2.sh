#!/usr/bin/env bash
# FLUX.2 [klein] 4B on one GPU in one call (random weights, bf16, 1024x1024, the pipeline's 50 steps):
#   1. our server, 1024x1024 compiled at warmup: the first text-to-image request after /ready
#      against steady c=1 (serve-suite: p50, peak GiB), images a minute at c=4 and c=8, then the
#      first edit with two 1024x1024 references against steady edits (bench/edit_latency.py: where the cold edit's time went,
#      node by node), recompiles in traffic from /metrics, first calls served eagerly from the log;
#   2. diffusers' Flux2KleinPipeline eager end to end at the same size and steps (c=1 p50, peak GiB);
#   3. our DiT step (deterministic compile) against diffusers' compiled transformer, same weights:
#      ms, roofline fraction, PSNR against diffusers eager.
#
#   bash bench/h200_flux2.sh        on the GPU, carrying .whl_pack and .whl_otel   ~8-9 min
#   bash bench/h200_flux2.sh e2e    parts 1 and 2 alone                            ~5-6 min
#   bash bench/h200_flux2.sh tiny   the same plumbing on the CPU (tiny configs)    ~3 min
#   bash bench/h200_flux2.sh step   part 3 alone, ours with and without triton_kernels, each
#                                   compiled deterministic and default, beside diffusers compiled
#                                   (carrying .whl_pack)                           ~6-8 min
#   bash bench/h200_flux2.sh step-tiny   the step part's plumbing on the CPU       ~2 min
# Results in $OUT/flux2 (default ./bench-results/flux2): each part's JSON and output, the server
# log; a table printed last. Every part runs within what is left of CALL_BUDGET_S (560), so the
# call ends inside 10 minutes and keeps what was measured.
# Knobs (environment): CALL_BUDGET_S, ATTENTION_BACKEND (fa3), PYTHON (python3), OUT, NUM_STEADY (3).
set -uo pipefail

PYTHON=${PYTHON:-python3}
mode=${1:-gpu}
steady=${NUM_STEADY:-3}
case "$mode" in
  gpu|e2e)
    served=flux2-klein-4b size=1024x1024 workload=flux2-1024 step_workload=flux2-1024-b1 steps=()
    server_flags=(--random-weights --device cuda --attention-backend "${ATTENTION_BACKEND:-fa3}")
    diffusers_flags=(--device cuda) step_flags=(--device cuda --attention-backends "${ATTENTION_BACKEND:-fa3}"
      --compile-modes deterministic --diffusers-modes compiled) ;;
  tiny)
    served=tests.models.flux2_klein.tiny_parts:TinyFlux2KleinSpec size=64x64 workload=tiny-flux2
    step_workload=tiny-flux2-c2 steps=(--steps 2) server_flags=(--random-weights --device cpu)
    diffusers_flags=(--device cpu) step_flags=(--tiny --device cpu --compile-modes off --diffusers-modes eager) ;;
  step)
    step_workload=flux2-1024-b1 step_modes=deterministic,default diffusers_step_modes=compiled
    step_flags=(--device cuda --attention-backends "${ATTENTION_BACKEND:-fa3}") ;;
  step-tiny)
    step_workload=tiny-flux2-c2 step_modes=off diffusers_step_modes=eager step_flags=(--tiny --device cpu) ;;
  *) echo "usage: bash bench/h200_flux2.sh [gpu|tiny|step|step-tiny]" >&2; exit 2 ;;
esac
out="${OUT:-$PWD/bench-results}/flux2"
mkdir -p "$out"
source "$(dirname "$0")/lib.sh"  # unpack_wheels, guarded, ready, stop_server
if [ "$mode" = gpu ] || [ "$mode" = step ]; then
  unpack_wheels || exit 1  # the GPU machine's wheels: server, diffusers, fa3
  nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
deadline=$((SECONDS + ${CALL_BUDGET_S:-560}))
serve() {  # our server: the first t2i request and the first edit, each against its steady latency
  local log="$out/server.log" started=$SECONDS
  setsid "$PYTHON" -m mstar.cli serve "$served" "${server_flags[@]}" --port 8765 --compile-sizes "$size" \
    > "$log" 2>&1 &
  server_pid=$!
  until ready http://127.0.0.1:8765/ready; do
    if ! kill -0 "$server_pid" 2> /dev/null || [ "$(left_s)" -lt 60 ]; then
      echo "serve: the server did not get ready; its last lines:"; tr '\r' '\n' < "$log" | tail -30
      stop_server; return 4
    fi
    sleep 1
  done
  local boot_s=$((SECONDS - started))
  echo "serve: ready after ${boot_s}s"
  guarded t2i 200 "$PYTHON" -m mstar.cli bench serve-suite --base-url http://127.0.0.1:8765 \
    --workload "$workload" --model flux2-klein-4b --boot-s "$boot_s" --num-steady "$steady" \
    --high-concurrency 4 --num-high 8 --num-mixed 0 --max-duration $(($(left_s) - 30)) -o "$out/t2i.json"
  guarded t2i-c8 120 "$PYTHON" -m mstar.cli bench serve-suite --base-url http://127.0.0.1:8765 \
    --workload "$workload" --model flux2-klein-4b --num-steady 0 --high-concurrency 8 --num-high 16 \
    --num-mixed 0 --max-duration $(($(left_s) - 30)) -o "$out/t2i-c8.json"
  guarded edit 200 "$PYTHON" bench/edit_latency.py --base-url http://127.0.0.1:8765 --model flux2-klein-4b \
    --num-references 2 --size "$size" --num-steady "$steady" "${steps[@]}" -o "$out/edit.json"
  echo "first calls served eagerly while they compiled: $(grep -c 'not compiled yet' "$log")"
  echo "recompile warnings in the server log: $(grep -c 'recompiled in traffic' "$log")"
  grep -h "not compiled yet\|recompiled in traffic" "$log" | tail -4
  stop_server
}

if [ "${mode#step}" != "$mode" ]; then  # the step alone: one JSON with the kernels, one without
  for kernels in 1 0; do  # diffusers compiled timed in the first; the second keeps its eager reference
    modes=$([ "$kernels" = 1 ] && echo "$diffusers_step_modes")
    MSTAR_FUSE_PROJECTIONS=1 MSTAR_TRITON_KERNELS=$kernels guarded "step-kernels-$kernels" "$(left_s)" \
      "$PYTHON" -m mstar.cli bench step --workloads "$step_workload" "${step_flags[@]}" \
      --compile-modes "$step_modes" --diffusers-modes "$modes" --num-warmup 3 --num-timed 10 \
      -o "$out/step-kernels-$kernels.json"
  done
  "$PYTHON" - "$out" "$step_workload" <<'EOF'
import json, sys
from pathlib import Path

out, workload = Path(sys.argv[1]), sys.argv[2]
rows, compiled = [], None
for kernels in ("1", "0"):
    path = out / f"step-kernels-{kernels}.json"
    runs = ((json.loads(path.read_text()).get("results") or [{}])[0] if path.exists() else {}).get("runs", [])
    for run in runs:
        if run.get("impl") == "diffusers":
            compiled = run if run.get("mode") == "compiled" else compiled
            rows.append((f"diffusers {run.get('mode')}", run))
        else:
            rows.append((f"ours {run.get('mode')}, triton_kernels {'on' if kernels == '1' else 'off'}", run))
print(f"\n| DiT step {workload} | ms | / diffusers compiled | roofline fraction | PSNR dB vs diffusers |")
print("|---|---|---|---|---|")
for name, run in rows:
    ms = run.get("median_ms")
    ratio = ms / compiled["median_ms"] if compiled and ms else None
    cells = [ms, ratio, run.get("roofline_fraction"), run.get("psnr_db")]
    print(f"| {name} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
EOF
  echo "== flux2 step: ${SECONDS}s; results in $out"
  exit 0
fi

serve
guarded diffusers 150 "$PYTHON" -m mstar.cli bench diffusers --workloads "$workload" --modes eager \
  --num-warmup 1 --num-timed 3 "${steps[@]}" "${diffusers_flags[@]}" -o "$out/diffusers.json"
[ "$mode" = e2e ] || guarded step "$(left_s)" "$PYTHON" -m mstar.cli bench step --workloads "$step_workload" "${step_flags[@]}" \
  --num-warmup 3 --num-timed 10 -o "$out/step.json"

"$PYTHON" - "$out" "$size" <<'EOF'
import json, sys
from pathlib import Path

out, size = Path(sys.argv[1]), sys.argv[2]

def load(name):
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}

def fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)

def ratio(a, b):
    return a / b if a is not None and b else None

t2i, edit, t2i_c8 = load("t2i").get("summary", {}), load("edit"), load("t2i-c8").get("summary", {})
diffusers = (load("diffusers").get("results") or [{}])[0]
runs = ((load("step").get("results") or [{}])[0]).get("runs", [])
ours = next((r for r in runs if r.get("impl") == "mstar"), {})
compiled = next((r for r in runs if r.get("impl") == "diffusers" and r.get("mode") == "compiled"), {})
edit_first = edit.get("cold_ms") and edit["cold_ms"] / 1000
edit_p50 = edit.get("p50_ms") and edit["p50_ms"] / 1000
edit_recompiles = edit.get("recompiles", {})
rows = [
    ("boot to /ready s", t2i.get("boot_s"), None, None),
    ("t2i: first s, steady p50 s (goal: first <= 1.1 x steady)", t2i.get("cold_latency_s"),
     t2i.get("steady_p50_s"), t2i.get("cold_over_steady")),
    ("edit, 2 refs: first s, steady p50 s", edit_first, edit_p50, edit.get("cold_over_steady")),
    ("recompiles in traffic: t2i, edits", t2i.get("recompiles_in_traffic"),
     None if None in (edit_recompiles.get("at_start"), edit_recompiles.get("at_end"))
     else edit_recompiles["at_end"] - edit_recompiles["at_start"], None),
    ("c=1 p50 s: ours, diffusers eager (goal: <= 0.6)", t2i.get("steady_p50_s"),
     diffusers.get("latency_p50_s"), ratio(t2i.get("steady_p50_s"), diffusers.get("latency_p50_s"))),
    ("images per minute: c=1, c=4", t2i.get("per_minute_c1"), t2i.get("per_minute_c4"),
     t2i.get("throughput_ratio")),
    ("images per minute: c=8", t2i_c8.get("per_minute_c8"), None, ratio(t2i_c8.get("per_minute_c8"),
     t2i.get("per_minute_c1"))),
    ("peak GiB: ours c=1 (allocated), diffusers", t2i.get("peak_gpu_allocated_c1_gib"),
     diffusers.get("peak_memory_gib"), None),
    ("DiT step ms: ours, diffusers compiled (goal: < 1)", ours.get("median_ms"), compiled.get("median_ms"),
     ratio(ours.get("median_ms"), compiled.get("median_ms"))),
    ("ours: roofline fraction (goal >= 0.8), PSNR dB vs diffusers", ours.get("roofline_fraction"),
     ours.get("psnr_db"), None),
]
print(f"\n| flux2-klein-4b {size} | value | against | ratio |\n|---|---|---|---|")
for name, value, against, quotient in rows:
    print(f"| {name} | {fmt(value)} | {fmt(against)} | {fmt(quotient)} |")
cold_nodes = edit.get("cold", {}).get("nodes", {})
steady_nodes = (edit.get("steady") or {}).get("nodes", {})
for node, cold in cold_nodes.items():
    print(f"edit {node}: first {cold['ms_per_request']:.1f} ms, steady "
          f"{steady_nodes.get(node, {}).get('ms_per_request', float('nan')):.1f} ms a request")
EOF
echo "== flux2: ${SECONDS}s; results in $out"
