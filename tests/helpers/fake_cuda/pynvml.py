"""NVML (nvidia-ml-py's `pynvml`) for the fake GPUs of fake_gpus.py.

NVML sees every GPU and MIG instance, whatever CUDA_VISIBLE_DEVICES says; a handle is
the device's UUID; NVML's index counts the GPUs (not their instances) in the list's order,
and a GPU's instances are its MIG devices 0, 1, … in the list's order. Serial numbers
come back as bytes, as older bindings return them; a MIG instance has no serial of its
own (NVML: Not Supported).
"""

from types import SimpleNamespace

try:
    import fake_gpus
except ImportError:  # imported in-process by a test, as helpers.fake_cuda.pynvml
    from helpers.fake_cuda import fake_gpus

DRIVER = "550.54.15"
CUDA_DRIVER = 12040


class NVMLError(Exception):
    pass


def _gpu(handle):
    for gpu in fake_gpus.gpus():
        if gpu["uuid"] == handle:
            return gpu
    raise NVMLError("Not Found")


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlSystemGetDriverVersion():
    return DRIVER


def nvmlSystemGetCudaDriverVersion_v2():
    return CUDA_DRIVER


def nvmlDeviceGetHandleByUUID(uuid):
    return _gpu(uuid)["uuid"]


def nvmlDeviceGetUUID(handle):
    return _gpu(handle)["uuid"]


def nvmlDeviceIsMigDeviceHandle(handle):
    return int("parent" in _gpu(handle))


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle):
    return _gpu(_gpu(handle)["parent"])["uuid"]


def nvmlDeviceGetSerial(handle):
    serial = _gpu(handle).get("serial")
    if serial is None:
        raise NVMLError("Not Supported")
    return serial.encode()


def nvmlDeviceGetPciInfo(handle):
    bus_id = _gpu(handle).get("pci_bus_id")
    if bus_id is None:
        raise NVMLError("Not Supported")
    return SimpleNamespace(busId=bus_id.encode())


def nvmlDeviceGetEccMode(handle):
    _gpu(handle)
    return (1, 1)


def _boards():
    return [g for g in fake_gpus.gpus() if "parent" not in g]


def nvmlDeviceGetCount():
    return len(_boards())


def nvmlDeviceGetHandleByIndex(index):
    boards = _boards()
    if not 0 <= index < len(boards):
        raise NVMLError("Invalid Argument")
    return boards[index]["uuid"]


def nvmlDeviceGetName(handle):
    return _gpu(handle)["name"]


def nvmlDeviceGetCudaComputeCapability(handle):
    major, minor = _gpu(handle)["cc"].split(".")
    return int(major), int(minor)


def nvmlDeviceGetMigMode(handle):
    gpu = _gpu(handle)
    if "parent" in gpu:
        raise NVMLError("Not Supported")
    mode = int(bool(gpu.get("mig_mode")))
    return [mode, mode]


def nvmlDeviceGetMaxMigDeviceCount(handle):
    _gpu(handle)
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(handle, index):
    instances = [g for g in fake_gpus.gpus() if g.get("parent") == handle]
    if not 0 <= index < len(instances):
        raise NVMLError("Not Found")
    return instances[index]["uuid"]


# The readings of `_telemetry` (issue 44): a GPU's "telemetry" dict, keyed as the agent
# records them; a GPU without one answers Not Supported, as a consumer board does.
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1


def _reading(handle, name):
    value = (_gpu(handle).get("telemetry") or {}).get(name)
    if value is None:
        raise NVMLError("Not Supported")
    return value


def nvmlDeviceGetTemperature(handle, sensor):
    assert sensor == NVML_TEMPERATURE_GPU
    return _reading(handle, "temperature_c")


def nvmlDeviceGetClockInfo(handle, clock):
    return _reading(handle, {NVML_CLOCK_SM: "sm_clock_mhz",
                             NVML_CLOCK_MEM: "memory_clock_mhz"}[clock])


def nvmlDeviceGetPowerUsage(handle):
    return int(_reading(handle, "power_w") * 1000)  # NVML answers in milliwatts


def nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type):
    kind = {NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected",
            NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected"}[error_type]
    scope = {NVML_VOLATILE_ECC: "volatile", NVML_AGGREGATE_ECC: "aggregate"}[counter_type]
    return _reading(handle, f"ecc_{kind}_{scope}")


def nvmlDeviceGetRemappedRows(handle):
    rows = _reading(handle, "remapped_rows")
    return tuple(rows)
