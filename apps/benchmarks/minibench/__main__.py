"""`python -m apps.benchmarks.minibench OUT_DIR [--seed N] [--profile full|ci] [--verbose]`."""

from __future__ import annotations

from .build import main

main()
