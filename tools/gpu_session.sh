#!/usr/bin/env bash
# One call on the GPU host: environment report, GPU tests, benchmarks; logs under $OUT.
#   bash tools/gpu_session.sh [tests] [int4] [decode] [typing] [wire] [ops]
#   (default: all but ops; ops = only the start-up self-check / telemetry tests, which
#   `tests` runs too; it also writes what `nib health --verbose` prints on this GPU)
# The host has python3 (3.12) with torch, triton, transformers preinstalled and no
# network: missing wheels travel in .whl/ (see README, "GPU runs").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/nib-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$(python3 tools/devtree.py)${PYTHONPATH:+:$PYTHONPATH}"
steps=${*:-tests int4 decode typing wire}
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton, transformers, grpc, google.protobuf as pb; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'grpcio', grpc.__version__, 'protobuf', pb.__version__)"
} 2>&1 | tee "$OUT/env.txt"
status=0
for step in $steps; do
  echo "=== $step $(date -u +%T)"
  case $step in
    tests)  # every GPU test, and the Triton kernels compiled against their references
      timeout 540 python3 -m pytest -p no:cacheprovider -q -rs tests/gpu tests/unit/test_kernels.py \
        --junitxml="$OUT/gpu-tests.xml" 2>&1 | tee "$OUT/gpu-tests.log" | tail -25
      status=$((status | ${PIPESTATUS[0]})) ;;
    int4)
      timeout 300 python3 bench/int4_linear.py --out bench/results --write-tuned 2>&1 | tee "$OUT/bench-int4.log" | tail -25
      status=$((status | ${PIPESTATUS[0]})) ;;
    decode)
      timeout 540 python3 bench/decode.py --out bench/results 2>&1 | tee "$OUT/bench-decode.log" | grep -v "^  " | tail -30
      status=$((status | ${PIPESTATUS[0]})) ;;
    typing)
      timeout 240 python3 bench/typing_trace.py --shape qwen2.5-coder-1.5b --device cuda 2>&1 | tee "$OUT/bench-typing.log" | tail -4
      status=$((status | ${PIPESTATUS[0]})) ;;
    ops)  # self-check, refusal on a corrupted kernel, versions, telemetry, health detail
      timeout 540 python3 -m pytest -p no:cacheprovider -q -rs -s tests/gpu/test_selfcheck_gpu.py \
        tests/gpu/test_ops_server_gpu.py --junitxml="$OUT/ops-tests.xml" 2>&1 | tee "$OUT/ops-tests.log" | tail -40
      status=$((status | ${PIPESTATUS[0]})) ;;
    wire)
      timeout 240 python3 bench/wire.py --shape qwen2.5-coder-1.5b 2>&1 | tee "$OUT/bench-wire.log" | tail -3
      status=$((status | ${PIPESTATUS[0]})) ;;
    *)
      echo "unknown step $step"; status=1 ;;
  esac
done
# Everything the run produced travels back in one archive (the tool returns at most 8 files).
tar czf "$OUT/results.tgz" bench/results bench/README.md engine/quant/tuned.json 2>/dev/null
echo "=== done $(date -u +%T) status $status"
exit $status
