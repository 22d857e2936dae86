"""The GPU's own readings beside the verdict (issue 44): temperature, clocks, power and
memory error counters, read through NVML at a run's start and end.

Silent data corruption grows with temperature (Alibaba's fleet study) and often comes
with corrected ECC errors or remapped rows; a suspect's readings next to its
disagreements tell a lab which to pull first. NVML (nvidia-ml-py's `pynvml`, optional, as
for the device list) is asked in a child process with a timeout, since a wedged GPU can
hang it; where it does not answer, a device has no `telemetry`, and nothing is guessed.
Xid errors are not counted: NVML reports them only as events to a listener registered
before they happen, which a run that lasts minutes is not.

`python -m numparity_agent._telemetry UUID...` prints {uuid: readings}. This module does
not import torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

# NVML's constants (nvml.h), as the bindings name them; the numbers where one lacks them.
_TEMPERATURE_GPU = ("NVML_TEMPERATURE_GPU", 0)
_CLOCK_SM = ("NVML_CLOCK_SM", 1)
_CLOCK_MEM = ("NVML_CLOCK_MEM", 2)
_ECC_CORRECTED = ("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
_ECC_UNCORRECTED = ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
_VOLATILE = ("NVML_VOLATILE_ECC", 0)
_AGGREGATE = ("NVML_AGGREGATE_ECC", 1)
TIMEOUT_S = 10.0


def _const(pynvml: Any, name: tuple[str, int]) -> int:
    return int(getattr(pynvml, name[0], name[1]))


def _readings(pynvml: Any, handle: Any) -> dict[str, Any]:
    """Each reading NVML gives for the device; one it refuses (Not Supported) is left out."""
    asks: dict[str, Callable[[], Any]] = {
        "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(
            handle, _const(pynvml, _TEMPERATURE_GPU)),
        "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, _const(pynvml, _CLOCK_SM)),
        "memory_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(
            handle, _const(pynvml, _CLOCK_MEM)),
        "power_w": lambda: round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1),
    }
    def ecc(error: tuple[str, int], counter: tuple[str, int]) -> Callable[[], Any]:
        return lambda: pynvml.nvmlDeviceGetTotalEccErrors(handle, _const(pynvml, error),
                                                           _const(pynvml, counter))

    for kind, error in (("corrected", _ECC_CORRECTED), ("uncorrected", _ECC_UNCORRECTED)):
        for scope, counter in (("volatile", _VOLATILE), ("aggregate", _AGGREGATE)):
            asks[f"ecc_{kind}_{scope}"] = ecc(error, counter)
    found: dict[str, Any] = {}
    for name, ask in asks.items():
        try:
            value = ask()
        except Exception:  # noqa: BLE001, S112 - NVML: Not Supported on this device
            continue
        found[name] = value if isinstance(value, int | float) else None
    try:
        corrected, uncorrected, pending, failed = pynvml.nvmlDeviceGetRemappedRows(handle)
        found.update(remapped_rows_corrected=int(corrected),
                     remapped_rows_uncorrected=int(uncorrected),
                     remap_pending=bool(pending), remap_failed=bool(failed))
    except Exception:  # noqa: BLE001, S110 - before Ampere: no row remapping
        pass
    return {k: v for k, v in found.items() if v is not None}


def read(uuids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """{uuid: readings} of the devices NVML finds by UUID and reads anything of (none
    without NVML)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - optional dependency, or no driver
        return {}
    found: dict[str, dict[str, Any]] = {}
    try:
        for uuid in uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:  # noqa: BLE001, S112 - not a device NVML knows
                continue
            readings = _readings(pynvml, handle)
            if readings:
                found[uuid] = readings
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110 - best effort
            pass
    return found


def read_in_child(uuids: Sequence[str], timeout: float = TIMEOUT_S
                  ) -> dict[str, dict[str, Any]]:
    """`read` in a child process: {} when it hangs past `timeout`, fails or prints
    something else (a wedged GPU never holds up the run)."""
    if not uuids:
        return {}
    try:
        done = subprocess.run([sys.executable, "-m", "numparity_agent._telemetry", *uuids],
                              capture_output=True, text=True, timeout=timeout)
        found = json.loads(done.stdout) if done.returncode == 0 else {}
    except (subprocess.TimeoutExpired, OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def main() -> int:
    json.dump(read(sys.argv[1:]), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
