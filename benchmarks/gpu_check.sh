#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (within 420 s; see GPU_CHECK_SECONDS):
#   1. the CUDA tests pass (tests/loaders/device/: test_cuda.py, test_cuda_ring.py,
#      test_cuda_decode.py);
#   2. with each mechanism they guard removed (--break-mechanism), the tests guarding it FAIL;
#   3. the loader tests pass with CUDA visible (pinning on by default there);
#   4. the GPU benchmarks: gpu.device_decode (torchvision's decode_jpeg against nvImageCodec
#      on the same stored JPEGs: samples/s, difference from Pillow, GPU memory per epoch),
#      formats.encoded --gpu (JPEG samples decoded on the GPU against the workers'
#      libjpeg-turbo, 224 crops a second and the GPU memory of each epoch), load.augment
#      (host-to-device GB/s, DeviceLoader + augmentation samples/s, step time with the
#      side-stream prefetch, GPU memory) and load.workers (0 against 2 workers with each
#      batch copied to the GPU, the ring pinned and not, the ring's copy GB/s and registration
#      time; then with --jpeg, JPEG decode + 224 crop in the workers).
#
#   bash benchmarks/gpu_check.sh                # on the GPU machine, from the repository root
#   bash benchmarks/gpu_check.sh --part tests   # only 1-3; --part bench: only 4 (a rerun of half)
#   bash benchmarks/gpu_check.sh --dry-run      # here, on the CPU: every step runs, CUDA's skip
#
# The whole check runs within GPU_CHECK_SECONDS (default 420, 1800 with --dry-run here: a GPU
# machine is lent for 15 minutes at a time, its start and a rerun of half included). Every
# step's time limit is its own or what is left of that budget, whichever is less; a step with
# nothing left is reported SKIP and fails the check. The guard runs (2.) go four at a time.
#
# The GPU machine has python3 with torch, numpy, pyarrow, xxhash, pytest and psutil, and no
# network: carry what is missing as wheels in .whl/ (blake3, and duckdb for the loader tests'
# where= filters, and pydantic with its own needs and simplejpeg for the datasets that etl packs
# in the tests, for Python 3.12; pydantic-core at the version pydantic pins), e.g. here:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
#     -d .whl blake3 duckdb simplejpeg pydantic==2.14.4 pydantic-core==2.50.5 \
#     annotated-types typing-inspection
# and nvImageCodec's in .whl-nvimgcodec/ (installed apart, below):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl-nvimgcodec \
#     nvidia-nvimgcodec-cu13 nvidia-nvjpeg
# and name both folders in the device tool's carry.
# Logs go to $OUT (the device tool's folder that comes back) or /tmp/gpu-check; the summary
# is printed last. Exit 0 when every check held.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
PART=all
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --part) PART=${2:-}; shift ;;
        *) echo "usage: gpu_check.sh [--dry-run] [--part tests|bench]" >&2; exit 2 ;;
    esac
    shift
done
case "$PART" in all | tests | bench) ;; *) echo "--part is tests or bench, not '$PART'" >&2; exit 2 ;; esac
BUDGET=${GPU_CHECK_SECONDS:-420}
[ "$DRY" = 1 ] && BUDGET=${GPU_CHECK_SECONDS:-1800}  # this 2-core machine is slower
DEADLINE=$((SECONDS + BUDGET))
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
[ "$DRY" = 1 ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
# NVIDIA nvImageCodec, #58's second GPU JPEG decoder, with its nvJPEG runtime: wheels carried in
# .whl-nvimgcodec/ (nvidia-nvimgcodec-cu13, nvidia-nvjpeg). Its wheel ships nvidia/__init__.py,
# which at the front of the path would hide torch's own nvidia.* libraries: so it goes in a
# folder of its own, without that file, at the end of the path; where torch's nvidia folder is a
# regular package (which hides a second one), the wheels are installed beside it instead.
if [ -d .whl-nvimgcodec ] && ls .whl-nvimgcodec/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-nvimgcodec \
        .whl-nvimgcodec/*.whl && rm -f /tmp/site-nvimgcodec/nvidia/__init__.py
    export PYTHONPATH=${PYTHONPATH:-}${PYTHONPATH:+:}/tmp/site-nvimgcodec
    if ! $PY -c "import torch, nvidia.nvimgcodec" >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile .whl-nvimgcodec/*.whl \
            || $PY -m pip install -q --no-index --no-deps --no-compile --break-system-packages \
                .whl-nvimgcodec/*.whl
    fi
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

note() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME EXPECTED_RC SECONDS COMMAND...: run, log to $OUT/NAME.log, check the exit code.
step() {
    local name=$1 expected=$2 limit=$3
    shift 3
    local left=$((DEADLINE - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -le 0 ]; then
        note "SKIP  $name: the ${BUDGET} s budget is spent"
        return
    fi
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    local took=$((SECONDS - start))
    if [ "$rc" = "$expected" ]; then
        note "ok    $name (exit $rc, ${took} s)"
    elif [ "$DRY" = 1 ] && [ "$expected" = 1 ] && grep -q "skipped" "$OUT/$name.log"; then
        note "dry   $name (no CUDA: its tests skipped, ${took} s)"
    else
        note "FAIL  $name: exit $rc, expected $expected (${took} s; see $name.log)"
    fi
}

# parallel N: wait until fewer than N background steps run.
parallel() {
    while [ "$(jobs -rp | wc -l)" -ge "$1" ]; do wait -n; done
}

{
    date -u
    nvidia-smi 2>&1 || echo "no nvidia-smi"
    $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
} > "$OUT/machine.txt" 2>&1
note "$(tail -1 "$OUT/machine.txt")"
note "nvImageCodec: $($PY -c 'import torch, nvidia.nvimgcodec as n; print(n.__version__)' 2>/dev/null \
    | tail -1 || true)"

CUDA_TESTS=(tests/loaders/device/test_cuda.py tests/loaders/device/test_cuda_ring.py
    tests/loaders/device/test_cuda_decode.py)
if [ "$PART" != bench ]; then
    step cuda-tests 0 150 $PY -m pytest -p no:cacheprovider -m cuda "${CUDA_TESTS[@]}" -q -rs
    for mechanism in record_stream wait_stream pinned_output nonblocking_params bound_device; do
        parallel 4
        step "break-$mechanism" 1 90 $PY -m pytest -p no:cacheprovider -m cuda \
            tests/loaders/device/test_cuda.py -q --break-mechanism "$mechanism" &
    done
    for mechanism in ring_pinned freed_after_copy; do
        parallel 4
        step "break-$mechanism" 1 90 $PY -m pytest -p no:cacheprovider -m cuda \
            tests/loaders/device/test_cuda_ring.py -q --break-mechanism "$mechanism" &
    done
    parallel 4
    step break-decoded_on_gpu 1 90 $PY -m pytest -p no:cacheprovider -m cuda \
        tests/loaders/device/test_cuda_decode.py -q --break-mechanism decoded_on_gpu &
    wait
    step loader-tests 0 150 $PY -m pytest -p no:cacheprovider -q -n 8 -m "not slow and not cuda" \
        tests/loaders
fi
if [ "$PART" = tests ]; then
    :
elif [ "$DRY" = 1 ]; then
    step bench-device-decode 0 120 $PY -m benchmarks.gpu.device_decode --photos 24 --epochs 2
    step bench-encoded 0 300 $PY -m benchmarks.formats.encoded --photos 24 --rounds 1
    step bench-augment 0 300 $PY -m benchmarks.load.augment --tiny --device cpu
    step bench-workers 0 120 $PY -m benchmarks.load.workers --samples 1000 --size 32 --rounds 1
    step bench-workers-jpeg 0 120 $PY -m benchmarks.load.workers --jpeg --samples 300 --rounds 1
else
    step bench-device-decode 0 60 $PY -m benchmarks.gpu.device_decode --photos 1000 --epochs 2
    step bench-encoded 0 80 $PY -m benchmarks.formats.encoded --gpu --photos 1000
    step bench-augment 0 60 $PY -m benchmarks.load.augment --quick
    step bench-workers 0 60 $PY -m benchmarks.load.workers --samples 2000 --rounds 2
    step bench-workers-jpeg 0 60 $PY -m benchmarks.load.workers --jpeg --samples 1000 --rounds 1
fi
if [ "$PART" != tests ]; then
    tail -n 40 "$OUT/bench-device-decode.log" "$OUT/bench-encoded.log" "$OUT/bench-augment.log" \
        "$OUT/bench-workers.log" "$OUT/bench-workers-jpeg.log"
fi
echo
echo "took $SECONDS s of the ${BUDGET} s budget (--part $PART)" >> "$SUMMARY"
cat "$SUMMARY"
! grep -q "^FAIL\|^SKIP" "$SUMMARY"
