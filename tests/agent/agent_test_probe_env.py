"""What a child process sees as it starts (run as `python -m agent_test_probe_env`, or
forked from the agent's fork server): printed as one JSON line."""

import ctypes
import json
import random
import sys

torch_before = "torch" in sys.modules  # forked: the server imported it; fresh: not yet

import torch  # noqa: E402

libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p


def c_getenv(name: str) -> str | None:
    value = libc.getenv(name.encode())
    return value.decode() if value is not None else None


print(json.dumps({
    "torch_imported_before": torch_before,
    "cuda_initialised": torch.cuda.is_initialized(),
    # As C code (CUDA's driver, ATen, cuBLAS) reads them.
    "getenv": {name: c_getenv(name) for name in
               ("CUBLAS_WORKSPACE_CONFIG", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")},
    "torch_threads": torch.get_num_threads(),
    # The fake GPUs (tests/helpers/fake_cuda) follow CUDA_VISIBLE_DEVICES as CUDA does.
    "devices": [torch.cuda.get_device_properties(i).uuid
                for i in range(torch.cuda.device_count())],
    "argv": sys.argv[1:],
    # The generators' first draws: torch's from its fixed default seed, Python's from
    # the system's entropy (each process its own).
    "torch_first_draw": torch.rand(1).item(),
    "python_first_draw": random.random(),
}))
