"""Puts bench/ on the import path: the kernel benchmarks in this folder share bench/common.py (and heap.py
bench/long_context.py) when run as `python bench/kernels/NAME.py` or through `python bench/run.py NAME`."""

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[1])
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
