from numparity_server.analysis import flatten_environment


def test_flatten_renders_leaves_and_drops_identity():
    environment = {
        "env_key": "abc",
        "python": {"version": "3.11.7", "implementation": "CPython"},
        "cpu": {"model": "Xeon", "logical_cpus": 2, "aten_cpu_capability_env": None,
                "hostname": "node-1"},
        "torch": {"version": "2.13.0", "mkl_available": True, "cudnn": None},
        "knobs": {"cudnn.benchmark": False, "matmul_precision": "highest", "scale": 0.5},
        "env_vars": {"MKL_CBWR": "COMPATIBLE"},
        "gpus": [
            {"index": 0, "name": "A100", "uuid": "GPU-1", "serial": "123", "driver": "550.1"},
            {"index": 1, "name": "A100", "uuid": "GPU-2", "serial": "456", "driver": "550.1"},
        ],
        "flags": ["avx2", "fma"],
        "unknown": {"gpus.0.ecc": "NVML not installed"},
    }
    flat = flatten_environment(environment)
    assert flat == {
        "python.version": "3.11.7",
        "python.implementation": "CPython",
        "cpu.model": "Xeon",
        "cpu.logical_cpus": "2",
        "cpu.aten_cpu_capability_env": "null",
        "torch.version": "2.13.0",
        "torch.mkl_available": "true",
        "torch.cudnn": "null",
        "knobs.cudnn.benchmark": "false",
        "knobs.matmul_precision": "highest",
        "knobs.scale": "0.5",
        "env_vars.MKL_CBWR": "COMPATIBLE",
        "gpus.0.index": "0",
        "gpus.0.name": "A100",
        "gpus.0.driver": "550.1",
        "gpus.1.index": "1",
        "gpus.1.name": "A100",
        "gpus.1.driver": "550.1",
        "flags": '["avx2","fma"]',
    }


def test_cpu_node_has_empty_gpu_list():
    assert flatten_environment({"gpus": [], "env_vars": {}}) == {"gpus": "[]"}


def test_short_difference_keeps_short_values_and_cuts_long_ones_to_what_differs():
    from numparity_server.analysis import short_difference

    assert short_difference("unset", "COMPATIBLE") == ("unset", "COMPATIBLE")
    flags = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36"
    a, b = short_difference(flags + " avx2 sse4_2 end", flags + " avx512f sse4_2 end")
    assert "avx2" in a and "avx512f" in b
    assert a.startswith("…") and len(a) < len(flags)
    a, b = short_difference("one\ntwo\nthree", "one\ntwo\n3")
    assert (a, b) == ("line 3: three", "line 3: 3")
    a, b = short_difference("one\ntwo", "one\ntwo\nthree")
    assert (a, b) == ("line 3: (no line)", "line 3: three")
