#!/bin/bash
# Create a virtualenv at $1 (default ./mosaic_venv) (CPU torch + mosaicml-streaming without its cloud/vision deps).
set -euo pipefail

VENV="${1:-mosaic_venv}"
python3.11 -m venv "$VENV"
"$VENV"/bin/pip install torch==2.13.0                      # +cpu build from /opt/wheels
"$VENV"/bin/pip install --no-deps mosaicml-streaming==0.13.0
"$VENV"/bin/pip install "numpy==2.1.3" pyarrow "transformers>=4.21.3,<5" \
    "Brotli>=1.0.9" "python-snappy>=0.6.1,<1" "zstd>=1.5.2.5,<2" "xxhash>=3,<4" \
    "catalogue>=2,<3" pillow
# torchvision is deliberately NOT installed: PyPI wheels need CUDA torch (a plain
# `pip install mosaicml-streaming` pulls torchvision 0.29.1 -> torch 2.14.1 + ~5 GB of CUDA libs).
# benchmarks/streaming_mosaic.py stubs the two torchvision names streaming/vision/base.py imports.
