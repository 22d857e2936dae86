"""Which devices a run measures (design §2.6): enumeration, `--device`, the plan.

The GPUs are not there: torch.cuda and NVML are the fakes of tests/helpers/fake_cuda,
in this process (monkeypatched) or in the agent's enumeration child (on PYTHONPATH).
"""

import json
import sys

import pytest
import torch
from helpers.agent import FAKE_CUDA, fake_gpu
from helpers.fake_cuda import fake_gpus
from helpers.fake_cuda import pynvml as fake_pynvml

from numparity_agent import _devices
from numparity_agent.testing import device_plan, drill_slot, main, visible_devices

A100 = fake_gpu(0)
V100 = fake_gpu(1, name="Tesla V100-SXM2-32GB", cc="7.0")
# A MIG instance of the A100: what CUDA calls it, and NVML's UUID for it.
MIG = {"uuid": "MIG-5c1d2e3f-0000-4000-8000-0000000000a1", "parent": A100["uuid"],
       "name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "cc": "8.0"}


def cpu_model() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        return next(line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name"))


@pytest.fixture
def node(monkeypatch):
    """Install fake GPUs for this process: node(gpus, visible=CUDA_VISIBLE_DEVICES,
    nvml=whether pynvml imports)."""
    def install(gpus, *, visible=None, nvml=True):
        monkeypatch.setenv(fake_gpus.ENV, json.dumps(gpus))
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        fake_gpus.patch_torch(torch, monkeypatch.setattr)
        # None in sys.modules: `import pynvml` raises ImportError, as without nvidia-ml-py.
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml if nvml else None)

    return install


def gpu_entry(slot, gpu, **fields):
    return {"device": slot, "type": "cuda", "index": int(slot.split(":")[1]),
            "uuid": gpu["uuid"], "serial": gpu.get("serial"),
            "pci_bus_id": gpu.get("pci_bus_id"), "name": gpu["name"],
            "compute_capability": gpu["cc"], "mig": False, **fields}


def test_every_gpu_with_the_identity_nvml_gives(node):
    node([A100, MIG, V100])
    # Without CUDA_VISIBLE_DEVICES CUDA shows the GPUs, not their MIG instances.
    assert visible_devices() == [gpu_entry("cuda:0", A100), gpu_entry("cuda:1", V100)]


def test_cuda_visible_devices_makes_a_mig_instance_a_device_and_hides_the_rest(node):
    node([A100, MIG, V100], visible=f"{MIG['uuid']},1")
    mig, v100 = visible_devices()
    # The instance's serial and PCI address are its board's (NVML has none of its own).
    assert mig == gpu_entry("cuda:0", MIG, mig=True, serial=A100["serial"],
                            pci_bus_id=A100["pci_bus_id"])
    assert v100 == gpu_entry("cuda:1", V100)  # index 1 among the boards: the V100
    node([A100, MIG, V100], visible=V100["uuid"])
    assert visible_devices() == [gpu_entry("cuda:0", V100)]


def test_without_nvml_torch_says_what_it_knows_and_the_rest_is_null(node):
    no_pci = fake_gpu(2, pci_bus_id=None)
    node([A100, MIG, no_pci], visible=f"0,{MIG['uuid']},1", nvml=False)
    a100, mig, other = visible_devices()
    # torch's UUID spelled as NVML does; the PCI address from torch's ids; no serial.
    assert a100 == gpu_entry("cuda:0", A100, serial=None)
    assert mig == gpu_entry("cuda:1", MIG, mig=True, serial=None,
                            pci_bus_id=A100["pci_bus_id"])
    assert other == gpu_entry("cuda:2", no_pci, serial=None, pci_bus_id=None)


def test_a_node_without_cuda_is_its_cpu(node):
    node([])
    assert visible_devices() == [{
        "device": "cpu", "type": "cpu", "index": None, "uuid": None, "serial": None,
        "pci_bus_id": None, "name": cpu_model(), "compute_capability": None, "mig": False,
    }]


def test_a_selection_is_slots_in_order_each_once():
    assert _devices.parse_selection("cuda:3, cuda:0,cuda:03 cpu") == ["cuda:3", "cuda:0", "cpu"]
    assert _devices.parse_selection("all") == ["all"]
    for bad in ("gpu0", "cuda", "cuda:-1", "cuda:x", ","):
        with pytest.raises(_devices.DeviceError):
            _devices.parse_selection(bad)


def test_all_is_every_gpu_else_the_cpu_and_an_invisible_one_is_named(node):
    node([A100, V100])
    visible = visible_devices()
    assert _devices.select(["all"], visible) == visible
    assert [d["device"] for d in _devices.select(["cuda:1", "all", "cpu"], visible)] == [
        "cuda:1", "cuda:0", "cpu"]
    node([])
    assert [d["device"] for d in _devices.select(["all"], visible_devices())] == ["cpu"]
    with pytest.raises(_devices.DeviceError,
                       match=r"no device cuda:2 on this node; visible: cuda:0, cuda:1, cpu$"):
        _devices.select(["cuda:2"], visible)


def test_the_reference_runs_once_on_the_cpu():
    gpus = [{"device": "cuda:0", "type": "cuda"}, {"device": "cuda:1", "type": "cuda"}]
    variants = ["default", "strict", "fp64-reference"]
    plan = device_plan(gpus, variants)
    assert [(d["device"], runs) for d, runs in plan] == [
        ("cuda:0", ["default", "strict"]), ("cuda:1", ["default", "strict"]),
        ("cpu", ["fp64-reference"])]
    assert plan[-1][0]["name"] == cpu_model()
    with_cpu = device_plan([*gpus, {"device": "cpu", "type": "cpu"}], variants)
    assert [(d["device"], runs) for d, runs in with_cpu] == [
        ("cuda:0", ["default", "strict"]), ("cuda:1", ["default", "strict"]),
        ("cpu", variants)]
    assert [d["device"] for d, _ in device_plan(gpus, ["fp64-reference"])] == ["cpu"]


def test_the_drill_device_is_one_of_the_run_the_first_by_default():
    devices = [{"device": "cuda:2"}, {"device": "cuda:5"}]
    assert drill_slot(devices, None) == "cuda:2"
    assert drill_slot(devices, "cuda:05") == "cuda:5"
    for bad in ("cuda:0", "cpu", "all", "cuda:2,cuda:5"):
        with pytest.raises(ValueError, match="its devices: cuda:2, cuda:5"):
            drill_slot(devices, bad)


def test_an_invisible_device_is_a_usage_error_naming_the_visible_ones(monkeypatch, capsys):
    """Through the CLI, whose enumeration child sees the fake GPUs."""
    monkeypatch.setenv("PYTHONPATH", str(FAKE_CUDA))
    monkeypatch.setenv(fake_gpus.ENV, json.dumps([A100, V100]))
    monkeypatch.setattr(_devices, "gpu_driver_present", lambda: True)  # as the fake's
    assert main(["run", "--workloads", "mlp", "--device", "cuda:0,cuda:7"]) == 2
    assert capsys.readouterr().err.rstrip().endswith(
        "usage: --device cuda:0,cuda:7: no device cuda:7 on this node; "
        "visible: cuda:0, cuda:1, cpu")


def test_a_gpu_that_hangs_the_listing_stops_the_run_with_exit_4(monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(FAKE_CUDA))
    monkeypatch.setenv(fake_gpus.ENV, json.dumps([A100, fake_gpu(1, wedged=True)]))
    monkeypatch.setattr(_devices, "gpu_driver_present", lambda: True)  # as the fake's
    assert main(["run", "--workloads", "mlp", "--timeout", "3"]) == 4
    err = capsys.readouterr().err
    assert "error: cannot list this node's devices: listing the devices timed out after 3 s" \
        in err
    assert ": running " not in err  # nothing ran


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--device", "gpu0"], {}, "--device gpu0: unknown device 'gpu0'"),
    ([], {"NUMPARITY_DEVICE": "cuda"}, "NUMPARITY_DEVICE cuda: unknown device 'cuda'"),
    (["--drill-device", "cpu"], {}, "--drill-device names the device of --fault-drill"),
    (["--device", "cpu", "--fault-drill", "--drill-device", "cuda:0"], {},
     "--drill-device cuda:0 is not one device of this run; its devices: cpu"),
])
def test_bad_device_options_are_usage_errors(monkeypatch, capsys, args, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["run", "--variants", "strict", *args]) == 2
    assert f"usage: {message}" in capsys.readouterr().err


def test_without_a_gpu_driver_all_is_the_cpu_and_no_child_asks_cuda(monkeypatch, tmp_path):
    """A Linux machine with none of the GPU drivers' device files: every device is the
    CPU, found without starting a child that imports torch."""
    from numparity_agent import _suite

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(_devices, "_DRIVER_PATHS", (str(tmp_path / "nvidiactl"),))
    assert not _devices.gpu_driver_present()

    def no_child(timeout):
        raise AssertionError("a child was started to list devices")

    monkeypatch.setattr(_suite, "list_devices", no_child)
    assert [d["device"] for d in _suite.select_devices("all")] == ["cpu"]
    with pytest.raises(_suite.UsageError, match="no device cuda:0 on this node; visible: cpu"):
        _suite.select_devices("cuda:0")
    (tmp_path / "nvidiactl").write_text("")
    assert _devices.gpu_driver_present()


def test_the_collectives_run_once_per_device_type_not_on_every_gpu():
    """An 8-GPU node: the collectives (NCCL over all eight) run on cuda:0 only, and on
    the CPU under the float64 reference; every other workload runs on every GPU."""
    from numparity_agent._suite import device_workloads

    gpus = [{"device": f"cuda:{i}", "type": "cuda"} for i in range(8)]
    plan = device_plan(gpus, ["default", "strict", "fp64-reference"])
    found = device_workloads(plan, ["mlp", "collectives"])
    assert [(d["device"], names) for (d, _), names in zip(plan, found, strict=True)] == [
        ("cuda:0", ["mlp", "collectives"]),
        *((f"cuda:{i}", ["mlp"]) for i in range(1, 8)),
        ("cpu", ["mlp", "collectives"])]
    cpu_only = device_plan([{"device": "cpu", "type": "cpu"}], ["default"])
    assert device_workloads(cpu_only, ["collectives"]) == [["collectives"]]


def test_a_mig_instances_environment_has_its_boards_ecc_and_serial(node):
    """torch's UUID of a MIG instance has no prefix; NVML knows it as `MIG-…` only, so
    the environment looks it up so (not as `GPU-…`), and takes the ECC mode and serial
    of the board it is carved from (issue 42, 11)."""
    from numparity_agent._environment import _gpus

    node([A100, MIG, V100], visible=MIG["uuid"])
    unknown: dict[str, str] = {}
    (gpu,) = _gpus(unknown)
    assert gpu["name"] == MIG["name"]
    assert gpu["ecc"] is True and gpu["serial"] == A100["serial"]
    assert gpu["driver"] == fake_pynvml.DRIVER
    assert not [key for key in unknown if key.startswith("gpus.0")], unknown


# An A100 in MIG mode carved into three instances, and a V100 that is not.
MIG_BOARD = fake_gpu(0, mig_mode=True)
INSTANCES = [{"uuid": f"MIG-5c1d2e3f-0000-4000-8000-0000000000b{n}",
              "parent": MIG_BOARD["uuid"], "name": "NVIDIA A100-SXM4-80GB MIG 2g.20gb",
              "cc": "8.0", "threads": 1 if n == 2 else 2} for n in range(3)]
MIG_NODE = [MIG_BOARD, *INSTANCES, V100]


def mig_entry(slot, instance, *, index=None):
    return {**gpu_entry(slot, instance, mig=True, serial=MIG_BOARD["serial"],
                        pci_bus_id=MIG_BOARD["pci_bus_id"]), "index": index}


def test_all_is_every_mig_instance_nvml_knows_though_cuda_shows_one(node):
    """CUDA enumerates one MIG instance per process: the others come from NVML, as
    devices after torch's (issue 42, 11)."""
    node(MIG_NODE)
    first, b, c = INSTANCES
    assert visible_devices() == [
        mig_entry("cuda:0", first, index=0), gpu_entry("cuda:1", V100),
        mig_entry("cuda:2", b), mig_entry("cuda:3", c)]
    # A GPU named by index shows CUDA its first instance: all of its instances are ours.
    node(MIG_NODE, visible="0")
    assert [d["uuid"] for d in visible_devices()] == [i["uuid"] for i in INSTANCES]


def test_a_schedulers_mig_allocation_is_what_all_runs(node):
    """A scheduler that gave this job two of the three instances: those two, not the
    third, though NVML sees it."""
    first, b, c = INSTANCES
    node(MIG_NODE, visible=f"{b['uuid']},{c['uuid']}")
    assert visible_devices() == [mig_entry("cuda:0", b, index=0), mig_entry("cuda:1", c)]
    node(MIG_NODE, visible=f"{V100['uuid']},{first['uuid']}")
    assert [d["uuid"] for d in visible_devices()] == [V100["uuid"], first["uuid"]]
    # Without NVML only what CUDA shows.
    node(MIG_NODE, visible=f"{b['uuid']},{c['uuid']}", nvml=False)
    assert [d["uuid"] for d in visible_devices()] == [b["uuid"]]


def test_a_run_measures_every_mig_instance_each_in_a_child_that_sees_it_alone(tmp_path):
    """The agent's `run` with no --device on the MIG node: one device per instance (and
    the V100), each computed by children whose CUDA_VISIBLE_DEVICES shows that instance
    alone. The fake instances compute with their own thread count: the one-thread
    instance's bits are a one-thread CPU's, the others' a two-thread CPU's."""
    from helpers.agent import fake_gpu_env, run_agent

    from numparity_agent.testing import load_workload, run_workload, variant

    workloads = ["mlp", "probes"]
    out = tmp_path / "doc.json"
    proc = run_agent("run", "--workloads", *workloads, "--variants", "default",
                     "--repeats", "1", "--output", str(out), env=fake_gpu_env(MIG_NODE),
                     timeout=600)
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    assert [(d["device"], d["uuid"]) for d in document["devices"]] == [
        ("cuda:0", INSTANCES[0]["uuid"]), ("cuda:1", V100["uuid"]),
        ("cuda:2", INSTANCES[1]["uuid"]), ("cuda:3", INSTANCES[2]["uuid"])]
    found: dict[str, dict] = {}
    for r in document["results"]:
        found.setdefault(r["device"], {})[r["workload"]] = {
            t["name"]: t["hash"] for t in r["tensors"]}
    expected: dict[int, dict] = {}
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            expected[threads] = {w: {t["name"]: t["hash"] for t in run_workload(
                load_workload(w), variant=variant("default"), device=torch.device("cpu"),
                repeats=1)["tensors"]} for w in workloads}
    finally:
        torch.set_num_threads(before)
    # NVML's list of the node's GPUs, for the server (every board and instance).
    assert document["node_gpus"] == [MIG_BOARD["uuid"], *(i["uuid"] for i in INSTANCES),
                                     V100["uuid"]]
    assert expected[1] != expected[2], "one thread and two give the same bits here"
    assert found["cuda:3"] == expected[1]
    assert found["cuda:0"] == found["cuda:2"] == expected[2]


def test_the_nodes_gpus_are_nvmls_whatever_a_scheduler_shows_the_run(node, monkeypatch):
    """A job given one GPU still says which GPUs the node has, so that the server does
    not take the others for gone (issue 42); anonymously, or without NVML, it says
    nothing."""
    every = [MIG_BOARD["uuid"], *(i["uuid"] for i in INSTANCES), V100["uuid"]]
    node(MIG_NODE, visible=V100["uuid"])
    assert [d["uuid"] for d in visible_devices()] == [V100["uuid"]]
    assert _devices.node_gpus() == every
    monkeypatch.setenv("NUMPARITY_ANONYMOUS_DEVICES", "1")
    assert _devices.node_gpus() is None
    monkeypatch.delenv("NUMPARITY_ANONYMOUS_DEVICES")
    node(MIG_NODE, visible=V100["uuid"], nvml=False)
    assert _devices.node_gpus() is None
