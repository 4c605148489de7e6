"""A job's hardware evidence: CPU, RAM and, where present, per-GPU utilisation, memory and temperature.

`sample()` reads one point: the job process and its children (a multi-device job's launcher and
ranks included) through psutil, and each GPU through NVML (nvidia-ml-py); with no NVML library or
no GPU, ``gpus`` is empty and nothing fails. The worker's `RunningJob` samples every
``RSI_HARDWARE_SAMPLE_SECONDS`` (10 by default, as MLflow and W&B do) into the job's
``metrics["hardware"]``; `summary()` turns those points into what the experiment node, the agents'
``job_hardware`` tool and the export show. Django-free and light (no torch): web processes read
summaries with it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import psutil

DEFAULT_SAMPLE_SECONDS = 10.0
MIB = 1024 * 1024
# What a job's error says when it ran out of memory: CUDA's and torch's messages, the kernel's OOM
# killer (SIGKILL: exit code -9 / 137), Python's MemoryError.
_OOM_MARKERS = ("out of memory", "outofmemoryerror", "memoryerror", "signal 9", "sigkill", "exit code -9",
                "exit code 137", "exitcode: -9")  # fmt: skip

_nvml_lock = threading.Lock()
_nvml_state: dict[str, Any] = {"tried": False, "module": None}


def sample_seconds() -> float:
    value = os.environ.get("RSI_HARDWARE_SAMPLE_SECONDS")
    return float(value) if value else DEFAULT_SAMPLE_SECONDS


def _nvml() -> Any:
    """The initialised pynvml module, or None where there is no NVML (no driver, no GPU)."""
    with _nvml_lock:
        if not _nvml_state["tried"]:
            _nvml_state["tried"] = True
            try:
                import pynvml  # noqa: PLC0415 - optional at run time: absent driver, absent GPU

                pynvml.nvmlInit()
                _nvml_state["module"] = pynvml
            except Exception:  # noqa: BLE001 - any NVML failure means "no GPU evidence", not a job failure
                _nvml_state["module"] = None
        return _nvml_state["module"]


def _gpus(indices: Sequence[int] | None) -> list[dict[str, Any]]:
    nvml = _nvml()
    if nvml is None:
        return []
    out = []
    try:
        count = nvml.nvmlDeviceGetCount()
        for index in indices if indices else range(count):
            if index >= count:
                continue
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            out.append({
                "index": index,
                "util_percent": float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                "memory_mib": round(memory.used / MIB, 1),
                "memory_total_mib": round(memory.total / MIB, 1),
                "temperature_c": float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            })  # fmt: skip
    except Exception:  # noqa: BLE001 - a GPU that stops answering mid-job: this point has none
        return []
    return out


class Sampler:
    """Samples one process tree; the first CPU reading primes psutil's counters (it reads 0)."""

    def __init__(self, pid: int | None = None, devices: Sequence[int] | None = None) -> None:
        self.root = psutil.Process(pid or os.getpid())
        self.devices = list(devices or [])
        self.started = time.monotonic()
        self._known: dict[int, psutil.Process] = {}
        for proc in self._tree():  # primes each process's CPU counter
            try:
                proc.cpu_percent(interval=None)
            except psutil.Error:
                continue

    def _tree(self) -> list[psutil.Process]:
        procs = [self.root]
        with contextlib.suppress(psutil.Error):
            procs += self.root.children(recursive=True)
        # The same Process objects across samples, so cpu_percent measures since the last sample.
        current = {p.pid: self._known.get(p.pid, p) for p in procs}
        self._known = current
        return list(current.values())

    def sample(self) -> dict[str, Any]:
        cpu = 0.0
        rss = 0
        for proc in self._tree():
            try:
                cpu += proc.cpu_percent(interval=None)
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
        memory = psutil.virtual_memory()
        return {
            "t": round(time.monotonic() - self.started, 1),
            "cpu_percent": round(cpu, 1),
            "ram_mib": round(rss / MIB, 1),
            "host_ram_percent": float(memory.percent),
            "gpus": _gpus(self.devices),
        }


def looks_like_oom(error: str) -> bool:
    lowered = error.lower()
    return any(marker in lowered for marker in _OOM_MARKERS)


def summary(samples: Iterable[dict[str, Any]], *, runtime_seconds: float | None, error: str = "") -> dict[str, Any]:
    """Runtime, peak RAM and CPU, peak memory (and utilisation, temperature) per GPU, and OOM or not."""
    points = list(samples)
    peak_gpu: dict[int, dict[str, float]] = {}
    for point in points:
        for gpu in point.get("gpus", []):
            peak = peak_gpu.setdefault(int(gpu["index"]), {"memory_mib": 0.0, "util_percent": 0.0,
                                                            "temperature_c": 0.0})  # fmt: skip
            for key in peak:
                peak[key] = max(peak[key], float(gpu.get(key) or 0.0))
            peak["memory_total_mib"] = float(gpu.get("memory_total_mib") or 0.0)
    return {
        "runtime_seconds": None if runtime_seconds is None else round(runtime_seconds, 1),
        "samples": len(points),
        "peak_ram_mib": max((float(p.get("ram_mib") or 0.0) for p in points), default=None),
        "peak_cpu_percent": max((float(p.get("cpu_percent") or 0.0) for p in points), default=None),
        "gpus": [{"index": index, **peak} for index, peak in sorted(peak_gpu.items())],
        "oom": looks_like_oom(error),
    }
