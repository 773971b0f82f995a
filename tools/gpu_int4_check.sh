#!/usr/bin/env bash
# One command for a GPU host (python3 with torch + triton, no network, repo not installed):
# the INT4 GPU tests, then the INT4 linear benchmark. Results go to $OUT (default ./gpu-out).
#   bash tools/gpu_int4_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/gpu-out}"
mkdir -p "$out"
export PYTHONPATH="$(python3 tools/devtree.py)${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
python3 -m pytest -p no:cacheprovider -o addopts="" -q -s --junitxml="$out/int4-gpu-tests.xml" \
    tests/gpu/test_int4_kernels.py tests/gpu/test_int4_quality.py 2>&1 | tee "$out/int4-gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
python3 bench/int4_linear.py --out "$out" --write-tuned 2>&1 | tee "$out/int4-bench.log"
bench_rc=${PIPESTATUS[0]}
cp bench/README.md engine/quant/tuned.json "$out/" 2>/dev/null
echo "tests rc=$tests_rc bench rc=$bench_rc"
exit $(( tests_rc != 0 || bench_rc != 0 ))
