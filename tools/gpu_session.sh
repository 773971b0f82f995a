#!/usr/bin/env bash
# One call on the GPU host: environment report, GPU tests, benchmarks; logs under $OUT.
#   bash tools/gpu_session.sh [tests|bench-decode|...]   (default: tests bench-decode)
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
steps=${*:-tests bench-decode}
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton, transformers, grpc, google.protobuf as pb; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'grpcio', grpc.__version__, 'protobuf', pb.__version__)"
} 2>&1 | tee "$OUT/env.txt"
status=0
for step in $steps; do
  echo "=== $step $(date -u +%T)"
  case $step in
    tests)
      timeout 300 python3 -m pytest -p no:cacheprovider -q -rs tests/gpu tests/unit/test_kernels.py --junitxml="$OUT/gpu-tests.xml" 2>&1 | tee "$OUT/gpu-tests.log" | tail -40
      status=$((status | ${PIPESTATUS[0]})) ;;
    bench-decode)
      timeout 420 python3 bench/decode.py --out bench/results 2>&1 | tee "$OUT/bench-decode.log" | tail -30
      status=$((status | ${PIPESTATUS[0]}))
      cp bench/results/*decode*.json bench/README.md "$OUT/" 2>/dev/null ;;
    *)
      echo "unknown step $step"; status=1 ;;
  esac
done
echo "=== done $(date -u +%T) status $status"
exit $status
