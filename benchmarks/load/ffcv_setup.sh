#!/usr/bin/env bash
# FFCV 1.0.2 in a venv of its own, for benchmarks.load.against_ffcv (never in the project's).
#   bash benchmarks/load/ffcv_setup.sh [VENV]      (default: .venv-ffcv)
# Needs root for apt-get (OpenCV and libjpeg-turbo headers, which FFCV's build links); torch
# comes from the local torch==2.13.0 file where the machine has one.
set -euo pipefail
venv="${1:-.venv-ffcv}"
if ! pkg-config --exists opencv4 libturbojpeg 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libopencv-dev libturbojpeg0-dev pkg-config
fi
python3.11 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0 numpy numba opencv-python-headless pillow tqdm \
    terminaltables psutil fastargs assertpy pandas setuptools wheel
"$venv/bin/pip" install -q --no-build-isolation ffcv==1.0.2
"$venv/bin/python" -c "import ffcv.loader, ffcv.writer; print('FFCV ready in $venv')"
