#!/usr/bin/env bash
# One call on the GPU host: GPU tests and benchmarks, inside a total time budget; logs
# and results come back as $OUT/results.tgz (the device tool returns at most 8 files).
#   bash tools/gpu_session.sh [cuda-tests] [w4a16-tests] [triton-tests] [micro] [tests] [tests-cuda] [tests-triton] [int4-tests] [int4] [typing] [decode] [wire] [wire-int4] [wire-trace] [wire-trace-int4] [wire-floors] [wire-switch] [wake] [timeline] [ends] [replay] [residue] [experiments-tests] [variants] [boundary] [ring] [ncu-w4a16] [int4-sweeps] [speculative] [speculative-1.5b] [speculative-7b] [ops] [stability] [stability-int4] [pick] [fused-pick]
# cuda-tests: the CUDA C++ kernels' GPU tests (tests/gpu/test_cuda_*.py); micro: their
# micro-benchmarks (bench/micro_*.py, CUDA vs Triton vs PyTorch in one run).
# tests: all of tests/gpu and tests/unit/test_kernels.py (over 400 s on the H200 since the
# GEMV tests run plain and PDL launches; TESTS_CAP defaults to 540); tests-cuda and
# tests-triton: its two halves, for two calls where one does not hold it.
# triton-tests: the Triton kernels compiled (tests/unit/test_kernels.py, plain and PDL
# launches).
# boundary: bench/micro_boundary.py (kernel boundary and grid-barrier probes; BOUNDARY_ARGS).
# ring: bench/micro_boundary.py's persistent ring probe on whole INT4 steps' bytes, against
#   chains of PDL launches (bench/README.md, "A persistent kernel that streams ahead");
#   RING_STEPS=qwen2.5-coder-1.5b-bf16,... for the 16-bit steps.
# timeline: bench/step_timeline.py (each kernel of a decode step on the GPU's clock; TIMELINE_ARGS).
# ends: bench/step_ends.py (the step's embedding and position advance, PyTorch's against nib's; ENDS_ARGS).
# fused-pick: bench/fused_pick.py (the greedy pick folded into the INT4 lm_head against a kernel of its own; PICK_BENCH_ARGS).
# residue: bench/profiler_residue.py (the decode step before and after a torch.profiler session; RESIDUE_ARGS).
# replay: bench/replay_timing.py (the step tuner's measure with and without the graph's launch; REPLAY_ARGS).
# tests leaves out tests/gpu/test_cuda_experiments.py: run experiments-tests beside it.
# variants: bench/cuda_variants.py (the kernel experiments in engine/cuda/loader.EXPERIMENTS
# against the plain build, one process, bit-identical logits checked; VARIANTS_ARGS).
# wire-int4: bench/wire.py on issue 6's INT4 models (WIRE_SHAPES); wire-floors: the floor
# RPC with gRPC's asyncio and sync servers, interleaved (WIRE_SPINS / FLOOR_SPINS: run them
# with that many spinners too, bench/spin.py). wake: bench/wake_latency.py (WAKE_ARGS).
# wire-trace-int4: bench/wire_trace.py on the 1.5B INT4 model, per TRACE_PATHS.
# wire-switch: the same with nib's server's GIL switch interval at each of SWITCH_US (µs).
# ncu-w4a16: NCU_SPECS kernels.
# pick: the pytest arguments in $PICK (e.g. PICK=tests/gpu/test_decode_core.py), PICK_CAP s.
# ops: only the start-up self-check / refusal / telemetry tests (tests/gpu runs them too),
# with what `nib health --verbose` prints on this GPU in its log.
# stability: issue 6's run (10,000 decode steps, 1,000 mixed requests; bench/stability.py) on
# the 16-bit 1.5B shape; stability-int4: the same with --quant int4 on STABILITY_SHAPES.
# The host has python3 (3.12) with torch, triton, transformers preinstalled and no
# network: missing wheels travel in .whl/ (`make gpu-wheels`; README, "GPU runs"). BUDGET_S caps the call.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/nib-out}
LOGS=/tmp/nib-logs
rm -rf "$LOGS"  # a machine kept between calls may hold an earlier session's logs
mkdir -p "$OUT" "$LOGS"
export PYTHONUNBUFFERED=1
deadline=$(( $(date +%s) + ${BUDGET_S:-570} ))
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$(python3 tools/devtree.py)${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton, transformers, grpc, google.protobuf as pb; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'grpcio', grpc.__version__, 'protobuf', pb.__version__)"
} > "$LOGS/env.txt" 2>&1
# run NAME CAP_SECONDS CMD...: at most CAP seconds, and never past the deadline.
run() {
  local name=$1 cap=$2; shift 2
  local left=$(( deadline - $(date +%s) - 20 ))
  (( left < cap )) && cap=$left
  if (( cap < 20 )); then echo "=== $name skipped: out of time"; return; fi
  echo "=== $name $(date -u +%T) (cap ${cap}s)"
  timeout "$cap" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc"
  tail -n "${TAIL:-12}" "$LOGS/$name.log"
}
# Steps that start `nib serve` or a whole engine time their runs under a cap; on a fresh
# machine the first would spend it in nvcc (2026-12-06: two wire-switch runs killed
# mid-build; 2026-12-07: a 7B stability-int4 run killed at 152 s on a fresh machine, whole
# in 140 s on the same machine warm). Build nib's CUDA modules once, under their own cap
# and log, before the first such step.
built=""
prebuild() {
  [ -n "$built" ] && return
  built=1
  run cuda-build ${BUILD_CAP:-300} python3 -c "import sys, torch; from nib.engine.cuda import loader; \
why = loader.unavailable_reason(torch.device('cuda')); print(why or 'nib CUDA modules built'); sys.exit(1 if why else 0)"
}
for step in ${*:-tests int4 typing decode}; do
  case $step in
    wire|wire-int4|wire-trace|wire-trace-int4|wire-switch|stability|stability-int4) prebuild ;;  # not wire-floors: gRPC alone
  esac
  case $step in
    tests|tests-cuda|tests-triton)
           # tests-cuda: everything but the Triton INT4 files; tests-triton: those and the
           # Triton kernels (tests/unit/test_kernels.py). On a fresh machine (every module
           # compiled first) the whole of `tests` outgrew one call's 540 s on 2026-12-04
           # (cut at 91%): run tests-cuda and tests-triton in two calls there.
           triton="tests/gpu/test_int4_fused_gemv.py tests/gpu/test_int4_kernels.py tests/unit/test_kernels.py"
           files=""
           [ "$step" != tests-triton ] && files="$(ls tests/gpu/test_*.py | grep -vxF -e tests/gpu/test_cuda_experiments.py $(printf -- '-e %s ' $triton))"
           [ "$step" != tests-cuda ] && files="$files $triton"
           TAIL=6 run "$step" ${TESTS_CAP:-540} python3 -m pytest -p no:cacheprovider -v --tb=short -rs \
             $files --junitxml="$LOGS/gpu-$step.xml"
           grep -E "(FAILED|ERROR)( |$)" "$LOGS/$step.log" | grep -v "^tests/gpu.* PASSED" | cut -c1-200 | head -30 ;;
    cuda-tests) TAIL=8 run cuda-tests ${CUDA_TESTS_CAP:-200} python3 -m pytest -p no:cacheprovider -q \
                  --maxfail=30 tests/gpu/test_cuda_*.py tests/gpu/test_step_tuning.py --junitxml="$LOGS/cuda-tests.xml"
                grep -E "^(FAILED|ERROR)" "$LOGS/cuda-tests.log" | cut -c1-200 | head -30 ;;
    boundary) TAIL=40 run boundary ${BOUNDARY_CAP:-120} python3 bench/micro_boundary.py --out bench/results \
                ${BOUNDARY_ARGS:---phases 64} ;;
    ring) TAIL=70 run ring ${RING_CAP:-300} python3 bench/micro_boundary.py --out bench/results \
            --phases 64 --ring 64,96,192 --ring-modes ,no-barrier,no-read,no-barrier-no-read --trace \
            --chain-blocks 132,264,528,1056 \
            --steps ${RING_STEPS:-qwen2.5-coder-1.5b-int4,qwen2.5-coder-1.5b-int4-4k,llama-2-7b-int4,llama-2-7b-int4-4k} ;;
    micro) for m in bench/micro_*.py; do
             name=$(basename "$m" .py)
             extra=""  # the 16-bit sweep compiles Triton tiles: the short list, in a budget
             [ "$name" = micro_gemv16 ] && extra="--quick --budget-s ${GEMV16_BUDGET:-100}"
             TAIL=14 run "$name" ${MICRO_CAP:-150} python3 "$m" --out bench/results $extra
           done ;;
    w4a16-tests) TAIL=8 run w4a16-tests ${W4_TESTS_CAP:-150} python3 -m pytest -p no:cacheprovider -q \
                   --maxfail=30 tests/gpu/test_cuda_w4a16.py --junitxml="$LOGS/w4a16-tests.xml"
                 grep -E "^(FAILED|ERROR)" "$LOGS/w4a16-tests.log" | cut -c1-200 | head -30 ;;
    ncu-w4a16) # the hardware's view of the 7B layer's INT4 kernels (ncu; Firecracker hosts only)
               # NCU_SPECS: "K N r,warps,pf,splits,bulk fusion [m]" per kernel, ';'-separated;
               # fusion - for none (m > 1 takes none: the plain product of m rows)
               IFS=';' read -ra specs <<< "${NCU_SPECS:-4096 12288 1,4,3,1,0 norm;11008 4096 1,8,4,1,0 residual;4096 22016 4,4,2,1,0 norm_glu}"
               for spec in "${specs[@]}"; do
                 set -- $spec
                 fusion=$4; [ "$fusion" = - ] && fusion=""
                 TAIL=${NCU_TAIL:-60} run "ncu-$1x$2-${3//,/.}-m${5:-1}" ${NCU_CAP:-60} ncu --clock-control none \
                   -k regex:w4a16_m --launch-skip 3 --launch-count 1 \
                   --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
                   --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats \
                   python3 tools/profile_w4a16.py --k $1 --n $2 --cfg $3 --fusion "$fusion" --m ${5:-1}
               done ;;
    triton-tests) TAIL=6 run triton-tests ${TRITON_TESTS_CAP:-200} python3 -m pytest -p no:cacheprovider -q \
                    tests/unit/test_kernels.py --junitxml="$LOGS/triton-tests.xml"
                  grep -E "^(FAILED|ERROR)" "$LOGS/triton-tests.log" | cut -c1-200 | head -20 ;;
    pick) TAIL=8 run pick ${PICK_CAP:-300} python3 -m pytest -p no:cacheprovider -q -rs $PICK \
            --junitxml="$LOGS/pick-tests.xml"
          grep -E "^(FAILED|ERROR)" "$LOGS/pick.log" | cut -c1-200 | head -20 ;;
    int4-tests) TAIL=8 run int4-tests ${INT4_TESTS_CAP:-150} python3 -m pytest -p no:cacheprovider -q -x \
                  tests/gpu/test_int4_fused_gemv.py ;;
    int4) run int4 ${INT4_CAP:-160} python3 bench/int4_linear.py --out bench/results --write-tuned --budget-s "${INT4_BUDGET:-45}" ;;
    typing) run typing 100 python3 bench/typing_trace.py --shape qwen2.5-coder-1.5b --device cuda --max-chars 1500 ;;
    decode) TAIL=16 run decode ${DECODE_CAP:-400} python3 bench/decode.py --out bench/results --reps 2 \
              --impls "${DECODE_IMPLS:-nib-graphs,nib-int4-graphs,torch-int4-compile}" ;;
    wire) run wire ${WIRE_CAP:-200} python3 bench/wire.py --shape qwen2.5-coder-1.5b ;;
    wire-int4) # issue 6's models: both shapes with INT4 weights (one row each in the JSON)
               # WIRE_SPINS: spinner counts (bench/spin.py) to run each shape with
               for shape in ${WIRE_SHAPES:-qwen2.5-coder-1.5b llama-2-7b}; do
                 for spin in ${WIRE_SPINS:-0}; do
                   run "wire-int4-$shape-spin$spin" ${WIRE_CAP:-240} python3 bench/wire.py --shape "$shape" \
                     --serve-arg=--quant=int4 --spin "$spin"
                 done
               done ;;
    wire-trace) run wire-trace ${TRACE_CAP:-110} python3 bench/wire_trace.py --shape qwen2.5-coder-1.5b \
                  --json "$LOGS/wire-trace.json"
                run wire-floor 60 python3 bench/wire_trace.py --floor --stub-ms 3,1.4 --json "$LOGS/wire-floor.json" ;;
    wire-trace-int4) # hop by hop on the 1.5B INT4 model; TRACE_PATHS: complete and/or session
                     for path in ${TRACE_PATHS:-complete session}; do
                       run "wire-trace-int4-$path" ${TRACE_CAP:-150} python3 bench/wire_trace.py \
                         --shape qwen2.5-coder-1.5b --serve-arg=--quant=int4 --path "$path" \
                         --reps 100 --json "$LOGS/wire-trace-int4-$path.json"
                     done ;;
    wire-floors) # the floor RPC (no nib in it) with gRPC's asyncio and sync servers, interleaved
                 # FLOOR_SPINS: spinner counts (bench/spin.py) to run each flavour with
                 for round in 1 2; do
                   for server in aio sync; do
                     for spin in ${FLOOR_SPINS:-0}; do
                       run "wire-floor-$server-$round-spin$spin" 60 python3 bench/wire_trace.py --floor \
                         --floor-server "$server" --stub-ms 3,1.4 --spin "$spin" \
                         --json "$LOGS/wire-floor-$server-$round-spin$spin.json"
                     done
                   done
                 done ;;
    wire-switch) # nib's server's GIL switch interval against the time to first token (1.5B
                 # INT4, bench/wire_trace.py --switch-us), interleaved: SWITCH_ROUNDS rounds,
                 # each running every SWITCH_PATHS path at every SWITCH_US interval once
                 for round in $(seq "${SWITCH_ROUNDS:-2}"); do
                   for path in ${SWITCH_PATHS:-session complete}; do
                     for us in ${SWITCH_US:-5000 100}; do
                       run "wire-switch-$path-$us-$round" ${SWITCH_CAP:-120} python3 bench/wire_trace.py \
                         --shape qwen2.5-coder-1.5b --serve-arg=--quant=int4 --path "$path" \
                         --reps 60 --switch-us "$us" --json "$LOGS/wire-switch-$path-$us-$round.json"
                     done
                   done
                 done ;;
    experiments-tests) # tests/gpu/test_cuda_experiments.py (kept out of `tests`: its own builds
              # and kernel tests take ~1-2 min, and `tests` already fills most of a call)
              TAIL=8 run experiments-tests ${EXP_TESTS_CAP:-300} python3 -m pytest -p no:cacheprovider -q -rs \
                tests/gpu/test_cuda_experiments.py --junitxml="$LOGS/experiments-tests.xml" ;;
    variants) # kernel experiments against the plain build, one process (bench/cuda_variants.py)
              # VARIANTS_FORCE: one KNOB=LABEL for --force (it holds spaces, VARIANTS_ARGS cannot);
              # VARIANTS_LIST: --variants, e.g. 'plain,cfg:int4 1536x8960 +residual=int4 mma16 r1w16p4'
              TAIL=30 run variants ${VARIANTS_CAP:-420} python3 bench/cuda_variants.py --out bench/results ${VARIANTS_ARGS:-} \
                ${VARIANTS_FORCE:+--force "$VARIANTS_FORCE"} ${VARIANTS_LIST:+--variants "$VARIANTS_LIST"} ;;
    replay) TAIL=30 run replay-timing ${REPLAY_CAP:-420} python3 bench/replay_timing.py --out bench/results \
              ${REPLAY_ARGS:-} ;;
    residue) TAIL=12 run profiler-residue ${RESIDUE_CAP:-300} python3 bench/profiler_residue.py --out bench/results \
               ${RESIDUE_ARGS:-} ;;
    ends) TAIL=12 run step-ends ${ENDS_CAP:-300} python3 bench/step_ends.py --out bench/results ${ENDS_ARGS:-} ;;
    fused-pick) TAIL=12 run fused-pick ${PICK_BENCH_CAP:-300} python3 bench/fused_pick.py --out bench/results ${PICK_BENCH_ARGS:-} ;;
    timeline) TAIL=60 run timeline ${TIMELINE_CAP:-420} python3 bench/step_timeline.py --out bench/results \
                ${TIMELINE_ARGS:-} ;;
    wake) TAIL=20 run wake ${WAKE_CAP:-90} python3 bench/wake_latency.py --out bench/results ${WAKE_ARGS:-} ;;
    int4-sweeps) TAIL=20 run int4-sweeps ${SWEEPS_CAP:-200} python3 -m pytest -p no:cacheprovider -v --tb=short \
                   --durations=15 tests/unit/test_kernels.py \
                   tests/gpu/test_int4_kernels.py::test_split_k_counters_reset_between_calls \
                   tests/gpu/test_int4_kernels.py::test_every_candidate_config_matches_reference ;;
    speculative) run speculative 120 python3 bench/speculative.py --device cuda ;;
    speculative-1.5b) run speculative-1.5b 150 python3 bench/speculative.py --device cuda --shape qwen2.5-coder-1.5b ;;
    speculative-7b) run speculative-7b 180 python3 bench/speculative.py --device cuda --shape llama-2-7b --new 64 ;;
    stability) run stability 300 python3 bench/stability.py --device cuda --shape qwen2.5-coder-1.5b ;;
    stability-int4) # issue 6's run on the INT4 path, each of STABILITY_SHAPES in turn
                    for shape in ${STABILITY_SHAPES:-qwen2.5-coder-1.5b llama-2-7b}; do
                      run "stability-int4-$shape" ${STABILITY_CAP:-300} python3 bench/stability.py \
                        --device cuda --shape "$shape" --quant int4
                    done ;;
    ops) TAIL=40 run ops 300 python3 -m pytest -p no:cacheprovider -q -rs -s \
           tests/gpu/test_selfcheck_gpu.py tests/gpu/test_ops_server_gpu.py --junitxml="$LOGS/ops-tests.xml" ;;
    *) echo "unknown step $step" ;;
  esac
done
cp -r bench/results "$LOGS/" 2>/dev/null; cp bench/README.md engine/quant/tuned.json "$LOGS/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$LOGS" .
echo "=== done $(date -u +%T)"
