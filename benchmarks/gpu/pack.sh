#!/usr/bin/env bash
# The packing scaling curve on the lent GPU machine's 16 CPU cores (no GPU used): cold `etl run`
# against the naive writer at 1, 2, 4, 8 and 16 jobs (benchmarks/pack/grid.py).
#
#   bash benchmarks/gpu/pack.sh              # on the GPU machine, from the repository root
#   bash benchmarks/gpu/pack.sh --dry-run    # here: a tiny grid, to check the script
#
# That machine has python3 with numpy, pyarrow, xxhash and psutil, no scikit-image and no
# network: carry the rest as wheels and the bundled photos as arrays in .whl/, e.g. here:
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
#     -d .whl blake3 pillow simplejpeg pyyaml typer click shellingham rich markdown-it-py \
#     mdurl pygments joblib pydantic pydantic-core annotated-types typing-inspection \
#     typing-extensions
#   python -m benchmarks.photos --export .whl/photo-sources
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-pack}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
# The default fits the lent machine's 15 minutes: the default backend ('auto'), 'loky'
# (processes only) and the naive writer at 1, 4 and 16 jobs. The shard sizes were measured
# there already (2026-11-26, benchmarks/README.md): set GRID_ARGS for another grid.
read -ra ARGS <<< "${GRID_ARGS:---sizes 1000,5000 --shards 256 --jobs 1,4,16 --rounds 2}"
if [ "${1:-}" = "--dry-run" ]; then
    PY=.venv/bin/python
    ARGS=(--sizes 40 --shards 16,256 --jobs 1,2 --rounds 1)
elif ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
[ -d .whl/photo-sources ] && export BENCH_PHOTO_SOURCES=$PWD/.whl/photo-sources
nproc | tee "$OUT/machine.txt"
$PY -c "import PIL, pyarrow, numpy, joblib; print(PIL.__version__, pyarrow.__version__, numpy.__version__, joblib.__version__)" | tee -a "$OUT/machine.txt"
$PY -m benchmarks.pack.grid "${ARGS[@]}" --work /tmp/grid-work --json "$OUT/grid.json" \
    > "$OUT/grid.md" 2> "$OUT/grid.log" || { tail -20 "$OUT/grid.log"; exit 1; }
cat "$OUT/grid.md"
