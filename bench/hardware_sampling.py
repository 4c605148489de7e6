"""Cost of one hardware sample (apps/jobs/hardware.py) and its share of a job at the default interval.

    python bench/hardware_sampling.py [--children 2] [--samples 200]

Starts `--children` idle Python processes under this one (a 2-rank job's shape: the sampler walks
the process tree), takes `--samples` samples, and prints the median and p95 time per sample and
the overhead at RSI_HARDWARE_SAMPLE_SECONDS=10 (median / 10 s). NVML is read where present.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apps.jobs.hardware import DEFAULT_SAMPLE_SECONDS, Sampler, _nvml  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--children", type=int, default=2)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(args.children)]
    try:
        sampler = Sampler()
        times = []
        for _ in range(args.samples):
            started = time.perf_counter()
            point = sampler.sample()
            times.append(time.perf_counter() - started)
        median, p95 = statistics.median(times), sorted(times)[int(0.95 * len(times)) - 1]
        print(f"{args.samples} samples of {1 + args.children} processes, NVML {'present' if _nvml() else 'absent'}, "
              f"{len(point['gpus'])} GPU(s)")  # fmt: skip
        print(f"per sample: median {median * 1e3:.2f} ms, p95 {p95 * 1e3:.2f} ms")
        share = median / DEFAULT_SAMPLE_SECONDS * 100
        print(f"overhead at one sample per {DEFAULT_SAMPLE_SECONDS:g} s: {share:.4f} % of one core")
    finally:
        for child in children:
            child.kill()
            child.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
