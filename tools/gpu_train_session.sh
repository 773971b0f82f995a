#!/usr/bin/env bash
# One GPU call: train the shipped model (training/run_all.py, ~9 minutes) and, while it
# trains, run every GPU correctness test (no timing is taken in this call). Results in $OUT:
# the model's shards + files tarball + train_log.txt (see training/unpack.py) and logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/nib-out}
mkdir -p "$OUT" /tmp/nib-logs
export PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-555}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > /tmp/nib-logs/env.txt 2>&1
python3 training/run_all.py --out "$OUT" --budget-s "$BUDGET" > /tmp/nib-logs/train_stdout.txt 2>&1 &
train_pid=$!
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
sleep ${TEST_DELAY:-45}  # let the corpus and tokenizer use the CPUs first
PYTHONPATH="$(python3 tools/devtree.py):/tmp/site" timeout 400 python3 -m pytest -p no:cacheprovider -q -rs \
  tests/gpu tests/unit/test_kernels.py --junitxml=/tmp/nib-logs/gpu-tests.xml > /tmp/nib-logs/gpu-tests.log 2>&1
echo "tests rc=$?" >> /tmp/nib-logs/gpu-tests.log
wait $train_pid
echo "train rc=$?" >> /tmp/nib-logs/train_stdout.txt
tar czf "$OUT/logs.tgz" -C /tmp/nib-logs .
tail -5 /tmp/nib-logs/gpu-tests.log
grep -E "^(FAILED|ERROR)" /tmp/nib-logs/gpu-tests.log | head -30
tail -25 /tmp/nib-logs/train_stdout.txt
ls -la "$OUT"
