#!/usr/bin/env bash
# #44's GPU goal on a lent GPU machine (about 4 minutes on one H100): the CUDA tests, then
# `formats.aspect --device cuda`: fixed 256x256 against aspect-kept storage of the same photos,
# loaded through DeviceLoader with RandomResizedCrop(224) on the GPU, aspect-kept batches sent
# back to back and, for comparison, padded (NOTE [ back to back ] in loaders/batch/ragged.py).
#
#   bash benchmarks/gpu/aspect.sh            # on the GPU machine, from the repository root
#   bash benchmarks/gpu/aspect.sh --dry-run  # here, on the CPU: tiny, to check the script
#
# Carry the wheels and photo sources that benchmarks/gpu/pack.sh lists in .whl/ (with
# duckdb and pytest-timeout for the tests). Results go to $OUT (or /tmp/gpu-aspect).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-aspect}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
read -ra ARGS <<< "${ASPECT_ARGS:---photos 2000 --rounds 3 --jobs 16 --device cuda}"
TESTS=(-m cuda tests/loaders/device/test_cuda.py)
if [ "${1:-}" = "--dry-run" ]; then
    PY=.venv/bin/python
    ARGS=(--photos 24 --rounds 1 --jobs 2 --device cpu)
elif ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
[ -d .whl/photo-sources ] && export BENCH_PHOTO_SOURCES=$PWD/.whl/photo-sources
$PY -c "import torch; print(torch.__version__, torch.cuda.is_available() and
        torch.cuda.get_device_name(0))" | tee "$OUT/machine.txt"
nproc | tee -a "$OUT/machine.txt"
$PY -m pytest -p no:cacheprovider -q -rs "${TESTS[@]}" > "$OUT/cuda-tests.log" 2>&1
echo "cuda tests: exit $?; $(tail -1 "$OUT/cuda-tests.log")"
$PY -m benchmarks.formats.aspect "${ARGS[@]}" --work /tmp/aspect-work > "$OUT/aspect.md" \
    2> "$OUT/aspect.log" || { tail -20 "$OUT/aspect.log"; exit 1; }
cat "$OUT/aspect.md"
