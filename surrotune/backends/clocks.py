"""The GPU's clocks, temperature and power while a kernel is timed, read-only.

A kernel's time depends on the SM and memory clocks it ran at, and those move with temperature,
power and the boost policy; a trial that records them can be explained (and discounted) later.
surrotune reads them and never sets them. The worker reads them once when it starts (stored with
the device properties) and once per timed configuration, while the timed launches run.

Sources, in order: NVML through ``pynvml`` (package ``nvidia-ml-py``) when importable — a call
takes microseconds; else ``nvidia-smi --query-gpu``, started as a subprocess while the timed
launches run so that its ~0.1 s cost overlaps them; else nothing, with the reason recorded.
Both address the GPU by PCI bus id, because CUDA's device numbers (``CUDA_VISIBLE_DEVICES``,
fastest-first order) need not be NVML's.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from typing import Any, Protocol

__all__ = [
    "CLOCK_FIELDS",
    "SMI_QUERY",
    "ClockReader",
    "NoClocks",
    "NvmlClocks",
    "PendingReading",
    "SmiClocks",
    "open_clock_reader",
    "parse_smi_line",
]

#: reading key -> what it holds; the keys are also the Result fields they land in
CLOCK_FIELDS = {
    "sm_clock_mhz": "SM clock, MHz",
    "memory_clock_mhz": "memory clock, MHz",
    "gpu_temperature_c": "GPU temperature, degrees Celsius",
    "gpu_power_w": "board power draw, W",
}
#: the nvidia-smi fields, in the order of CLOCK_FIELDS
SMI_QUERY = "clocks.sm,clocks.mem,temperature.gpu,power.draw"
_SMI_TIMEOUT_S = 5.0


class PendingReading(Protocol):
    def result(self) -> dict[str, float]:
        """The reading (an empty dict when it failed); waits for it if needed."""
        ...


class ClockReader(Protocol):
    #: ``pynvml``, ``nvidia-smi`` or ``none``
    source: str
    #: why this source and not a better one (empty when pynvml works)
    note: str

    def start(self) -> PendingReading:
        """Begin a reading now; collect it with :meth:`PendingReading.result`."""
        ...


class _Ready:
    def __init__(self, reading: dict[str, float]) -> None:
        self.reading = reading

    def result(self) -> dict[str, float]:
        return self.reading


class NoClocks:
    """No source works here; every reading is empty and ``note`` says why."""

    source = "none"

    def __init__(self, note: str) -> None:
        self.note = note

    def start(self) -> PendingReading:
        return _Ready({})


class NvmlClocks:
    """NVML through pynvml: synchronous, microseconds per reading."""

    source = "pynvml"
    note = ""

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self.pynvml = pynvml
        self.handle = handle

    def start(self) -> PendingReading:
        nvml, handle = self.pynvml, self.handle
        reading: dict[str, float] = {}
        queries = (
            ("sm_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            ("memory_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
            (
                "gpu_temperature_c",
                lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            ),
            ("gpu_power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
        )
        for key, query in queries:
            with contextlib.suppress(Exception):  # a field the board does not report
                reading[key] = float(query())
        return _Ready(reading)


def parse_smi_line(text: str) -> dict[str, float]:
    """One line of ``nvidia-smi --query-gpu=SMI_QUERY --format=csv,noheader,nounits``.

    Fields the board does not report (``[N/A]``, ``[Not Supported]``) are left out.
    """
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return {}
    values = [value.strip() for value in lines[0].split(",")]
    reading: dict[str, float] = {}
    for key, value in zip(CLOCK_FIELDS, values, strict=False):
        with contextlib.suppress(ValueError):
            reading[key] = float(value)
    return reading


class _SmiPending:
    def __init__(self, process: subprocess.Popen[str] | None) -> None:
        self.process = process

    def result(self) -> dict[str, float]:
        if self.process is None:
            return {}
        try:
            out, _ = self.process.communicate(timeout=_SMI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            return {}
        return parse_smi_line(out) if self.process.returncode == 0 else {}


class SmiClocks:
    """nvidia-smi, one subprocess per reading, started before it is needed."""

    source = "nvidia-smi"

    def __init__(self, executable: str, device: str, note: str) -> None:
        self.command = [
            executable,
            f"--id={device}",
            f"--query-gpu={SMI_QUERY}",
            "--format=csv,noheader,nounits",
        ]
        self.note = note

    def start(self) -> PendingReading:
        try:
            process = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        except OSError:
            return _SmiPending(None)
        return _SmiPending(process)


def _nvml_reader(pci_bus_id: str | None, device_index: int) -> NvmlClocks:
    import pynvml

    pynvml.nvmlInit()
    if pci_bus_id:
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
    else:
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
    reader = NvmlClocks(pynvml, handle)
    if "sm_clock_mhz" not in reader.start().result():
        raise RuntimeError("NVML answers but reports no SM clock")
    return reader


def open_clock_reader(pci_bus_id: str | None, device_index: int) -> ClockReader:
    """The best source that works for this GPU, tried now, so that a trial never waits on one
    that fails. ``pci_bus_id`` is CUDA's ``deviceGetPCIBusId``; without it NVML's index is
    taken to be ``device_index`` (true only when the device orders agree)."""
    try:
        return _nvml_reader(pci_bus_id, device_index)
    except ImportError:
        why = "pynvml is not installed (pip install nvidia-ml-py)"
    except Exception as exc:  # NVMLError and friends: no driver, no permission, unknown id
        why = f"NVML failed: {exc}"
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return NoClocks(f"{why}; nvidia-smi is not on PATH")
    reader = SmiClocks(executable, pci_bus_id or str(device_index), note=why)
    if "sm_clock_mhz" not in reader.start().result():
        return NoClocks(f"{why}; nvidia-smi --id={pci_bus_id or device_index} gave no clocks")
    return reader
