"""Op traces (`run --trace-ops`, design §2.10): what the agent records of every op.

The oracle for references is an independent hash of the recorded tensors (hashlib over
numpy's bytes, not the agent's fingerprint code); for the trace hash, the canonical JSON
recomputed here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from numparity_agent import _trace
from numparity_agent.testing import load_workload, run_workload, variant

CPU = torch.device("cpu")


def _traced(name: str, variant_name: str = "default", **kwargs: Any) -> dict[str, Any]:
    result = run_workload(load_workload(name), variant=variant(variant_name), device=CPU,
                          repeats=1, trace=True, **kwargs)
    assert result["status"] == "ok", result.get("error")
    assert "trace" in result, result.get("trace_error")
    return result


def _reference_of(tensor: torch.Tensor) -> str:
    array = tensor.detach().contiguous().numpy()
    digest = hashlib.sha256(
        f"{str(tensor.dtype).removeprefix('torch.')};{','.join(map(str, tensor.shape))};"
        .encode())
    digest.update(array.astype(array.dtype.newbyteorder("<")).tobytes())
    return digest.hexdigest()[:16]


def test_a_trace_lists_the_ops_of_the_model_with_their_modules_and_tensors() -> None:
    result = _traced("mlp")
    trace = result["trace"]
    ops = trace["ops"]
    assert trace["format"] == "numparity.trace/v1" and trace["hash_chars"] == 16
    modules = {name for name, _ in load_workload("mlp").build(
        dtype=torch.float32, device=CPU).model.named_modules() if name}
    # Every op ran under one of the model's modules, forward only, and the recorder's
    # own copies of tensors are not ops of the workload.
    assert ops and {op["module"] for op in ops} <= modules
    assert {op["phase"] for op in ops} == {"forward"}
    assert not any(op["op"] in ("aten.clone.default", "aten.detach.default") for op in ops)
    # Each reference is described, and each layer's output is the output of an op of
    # that layer, by the start of its fingerprint hash.
    used = {ref for op in ops for ref in op["in"] + op["out"]}
    assert used == set(trace["tensors"])
    for tensor in result["tensors"]:
        if tensor["kind"] != "layer":
            continue
        producers = [op for op in ops if tensor["hash"][:16] in op["out"]]
        assert producers and producers[-1]["module"] == tensor["name"]
        assert trace["tensors"][tensor["hash"][:16]] == [tensor["dtype"], tensor["shape"]]


def test_references_are_the_fingerprint_hashes_of_the_tensors_an_op_read_and_wrote() -> None:
    built = load_workload("mlp").build(dtype=torch.float32, device=CPU)
    x = next(iter(built.inputs.values()))
    with _trace.tracing(built.model) as tracer, torch.no_grad():
        out = built.model(x)
    first_linear = next(op for op in tracer.ops if op["op"] == "aten.addmm.default")
    fc = next(m for m in built.model.modules() if isinstance(m, torch.nn.Linear))
    assert first_linear["in"] == [_reference_of(fc.bias), _reference_of(x),
                                  first_linear["in"][2]]
    assert tracer.ops[-1]["out"] == [_reference_of(out)]


def test_the_trace_hash_is_the_sha256_of_its_canonical_json() -> None:
    trace = _traced("cnn")["trace"]
    body = {k: v for k, v in trace.items() if k != "hash"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert trace["hash"] == hashlib.sha256(canonical.encode()).hexdigest()
    # No floats anywhere: any JSON library writes it alike.
    def leaves(value: Any) -> Iterator[Any]:
        if isinstance(value, dict):
            for item in value.values():
                yield from leaves(item)
        elif isinstance(value, list):
            for item in value:
                yield from leaves(item)
        else:
            yield value

    assert {type(leaf) for leaf in leaves(body)} <= {str, int}


def test_tracing_changes_no_fingerprint_and_a_steady_computation_gives_the_same_trace() -> None:
    plain = run_workload(load_workload("transformer"), variant=variant("strict"), device=CPU,
                         repeats=1)
    traced = _traced("transformer", "strict")
    again = _traced("transformer", "strict")
    assert [t["hash"] for t in traced["tensors"]] == [t["hash"] for t in plain["tensors"]]
    assert traced["trace"]["hash"] == again["trace"]["hash"]


def test_training_names_backward_ops_by_their_module_and_the_optimizer_step() -> None:
    ops = _traced("train")["trace"]["ops"]
    phases = [op["phase"] for op in ops]
    assert phases.index("forward") < phases.index("backward") < phases.index("optimizer")
    backward = [op for op in ops if op["phase"] == "backward"]
    # The gradient of a Linear's weight is an mm run for that Linear.
    assert {op["module"] for op in backward if op["op"] == "aten.mm.default"} == {"fc1", "fc2"}
    assert {op["module"] for op in ops if op["phase"] == "optimizer"} == {""}


def test_kernel_choices_torch_makes_are_recorded() -> None:
    conv_ops = [op for op in _traced("cnn")["trace"]["ops"]
                if op["op"] == "aten.convolution.default"]
    built = load_workload("cnn").build(dtype=torch.float32, device=CPU)
    conv = built.model.conv1
    x = next(iter(built.inputs.values()))
    expected = torch._C._select_conv_backend(
        x, conv.weight, conv.bias, list(conv.stride), list(conv.padding), list(conv.dilation),
        False, [0, 0], conv.groups, None)
    assert conv_ops and conv_ops[0]["kernel"] == f"conv:{expected.name}"
    sdpa = [op for op in _traced("transformer")["trace"]["ops"]
            if "scaled_dot_product" in op["op"]]
    assert sdpa and all(op["kernel"].startswith("sdpa:") for op in sdpa)
    # The math backend is a composition of ops: they are what the trace shows in the
    # attention module, where a fused backend shows its one op.
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        math = [op for op in _traced("transformer")["trace"]["ops"]
                if op["module"] == sdpa[0]["module"]]
    assert not any("kernel" in op for op in math)
    names = {op["op"] for op in math}
    assert "aten.bmm.default" in names and any("softmax" in name for name in names)


def test_a_trace_of_another_computation_is_dropped_with_the_reason(monkeypatch) -> None:
    from numparity_agent import _runner

    real = _runner.trace_ops

    def drifting(*args: Any, expected: list[tuple[str, str]], **kwargs: Any) -> Any:
        return real(*args, expected=[(n, "0" * 64) for n, _h in expected], **kwargs)

    monkeypatch.setattr(_runner, "trace_ops", drifting)
    result = run_workload(load_workload("mlp"), variant=variant("default"), device=CPU,
                          repeats=1, trace=True)
    assert result["status"] == "ok" and "trace" not in result
    assert "other bits than the fingerprinted one" in result["trace_error"]


def test_the_collectives_are_not_traced() -> None:
    assert load_workload("collectives").traceable is False


# ---- CUDA kernel names, with a fake profiler at the edge (no GPU here) -----------------


def _event(name: str, *, children: list[Any] = (), kernels: list[str] = (),
           device: str = "DeviceType.CPU") -> SimpleNamespace:
    return SimpleNamespace(name=name, cpu_children=list(children), device_type=device,
                           kernels=[SimpleNamespace(name=k) for k in kernels])


def _raw(name: str, corr: int, start: int, end: int, *, thread: int = 1, linked: int = 0,
         device: str = "DeviceType.CPU") -> SimpleNamespace:
    """A raw profiler event (`_KinetoEvent`): what `_join_raw` reads of one."""
    return SimpleNamespace(
        name=lambda: name, device_type=lambda: device, correlation_id=lambda: corr,
        linked_correlation_id=lambda: linked, start_ns=lambda: start, end_ns=lambda: end,
        start_thread_id=lambda: thread)


def test_kernels_join_the_annotation_around_the_op_that_launched_them() -> None:
    events = [
        _raw("numparity#0#3", 1, 100, 200),
        _raw("aten::addmm", 2, 110, 190),
        _raw("numparity#1#0", 3, 300, 400),
        _raw("aten::mm", 4, 310, 390),
        _raw("numparity#1#7", 5, 500, 600),  # a range that launched nothing
        _raw("aten::add", 6, 700, 710),  # outside every range: not an op of ours
        _raw("numparity#0#9", 7, 100, 200, thread=2),  # another thread, same times
        _raw("ampere_sgemm_128x64_tn", 8, 5, 6, linked=2, device="DeviceType.CUDA"),
        _raw("splitKreduce_kernel", 9, 7, 8, linked=2, device="DeviceType.CUDA"),
        _raw("ampere_sgemm_128x64_tn", 10, 9, 9, linked=2, device="DeviceType.CUDA"),
        _raw("sm90_xmma_gemm_tf32", 11, 9, 9, linked=4, device="DeviceType.CUDA"),
        _raw("vectorized_elementwise_kernel", 12, 9, 9, linked=6, device="DeviceType.CUDA"),
        # a kernel launched right inside the annotation (no op recorded below it)
        _raw("flash_fwd_kernel", 13, 9, 9, linked=3, device="DeviceType.CUDA"),
    ]
    assert _trace._join_raw(events, "numparity#") == {
        ("0", 3): ["ampere_sgemm_128x64_tn", "splitKreduce_kernel"],
        ("1", 0): ["sm90_xmma_gemm_tf32", "flash_fwd_kernel"]}


def test_a_runtime_calls_correlation_id_never_stands_for_an_op() -> None:
    """CUPTI numbers the runtime calls (`cudaLaunchKernel`, a CPU event) from its own
    counter, which starts near 1 as the ops' does: runtime call 2 (launched by op 4,
    inside annotation 1#0) must not take the place of op 2 (inside 0#3), whose kernels
    stay its own. torch's parser keys only the events whose linked id is 0."""
    events = [
        _raw("numparity#0#3", 1, 100, 200),
        _raw("aten::addmm", 2, 110, 190),
        _raw("cudaLaunchKernel", 1, 120, 125, linked=2),  # CUPTI's 1: op 2's launch
        _raw("numparity#1#0", 3, 300, 400),
        _raw("aten::mm", 4, 310, 390),
        _raw("cudaLaunchKernel", 2, 320, 325, linked=4),  # CUPTI's 2: op 4's launch
        _raw("ampere_sgemm_128x64_tn", 1, 5, 6, linked=2, device="DeviceType.CUDA"),
        _raw("sm90_xmma_gemm_tf32", 2, 7, 8, linked=4, device="DeviceType.CUDA"),
    ]
    assert _trace._join_raw(events, "numparity#") == {
        ("0", 3): ["ampere_sgemm_128x64_tn"], ("1", 0): ["sm90_xmma_gemm_tf32"]}


def test_without_raw_events_the_kernels_come_from_the_profilers_tree() -> None:
    events = [
        _event("numparity#0#0", children=[_event("aten::addmm", kernels=[
            "ampere_sgemm_128x64_tn", "splitKreduce_kernel"])]),
        _event("numparity#0#1", children=[_event("aten::convolution", children=[
            _event("implicit_convolve_sgemm", device="DeviceType.CUDA")])]),
        _event("numparity#0#2"),
        _event("aten::other", kernels=["not_an_op_of_ours"]),
    ]
    session = _trace.KernelSession()
    # kineto_results missing: the raw events cannot be read, the tree is.
    session._profiler = SimpleNamespace(function_events=events)
    ops = [{"op": "aten.addmm.default"}, {"op": "aten.convolution.default", "kernel": "x"},
           {"op": "aten.mm.default"}]
    session.annotate("0", ops)
    assert ops == [{"op": "aten.addmm.default",
                    "kernel": "ampere_sgemm_128x64_tn; splitKreduce_kernel"},
                   {"op": "aten.convolution.default", "kernel": "x; implicit_convolve_sgemm"},
                   {"op": "aten.mm.default"}]


def test_opening_a_profiler_session_does_not_import_inductor() -> None:
    """torch.profiler.profile's prepare_trace evaluates `hasattr(torch, "_inductor")`,
    which imports inductor (seconds of every traced child); the session the agent opens
    does not. A fresh interpreter: this one may have imported inductor already."""
    import subprocess
    import sys

    code = ("import sys, time, torch\n"
            "from numparity_agent import _trace\n"
            "start = time.perf_counter()\n"
            "with _trace.open_profiler('cpu'):\n"
            "    torch.ones(4).add_(1)\n"
            "print('torch._inductor' in sys.modules, time.perf_counter() - start)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    imported, _seconds = done.stdout.split()
    assert imported == "False"


_REAL_OPEN = _trace.open_profiler
TF32_GEMM = "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16"


class _FakeCudaProfiler:
    """The agent's profiler session on the CPU, whose raw events also have, for every
    addmm, the runtime call that launched its kernel and a TF32 GEMM kernel: what a CUDA
    profile of the same ops shows. The runtime calls are numbered as CUPTI numbers them,
    from 1, so their correlation ids collide with the real ops'. Every other event is
    the real profiler's (correlation ids, threads, times, annotations)."""

    sessions = 0

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self._real = _REAL_OPEN("cpu")
        _FakeCudaProfiler.sessions += 1

    def __enter__(self) -> _FakeCudaProfiler:
        self._real.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._real.__exit__(*exc)
        real_events = list(self._real.kineto_results.events())
        gemms = [e for e in real_events if e.name() == "aten::addmm"]
        launches = [_raw("cudaLaunchKernel", cupti, e.start_ns(), e.start_ns(),
                         thread=e.start_thread_id(), linked=e.correlation_id())
                    for cupti, e in enumerate(gemms, start=1)]
        kernels = [_raw(TF32_GEMM, cupti, 0, 0, linked=e.correlation_id(),
                        device="DeviceType.CUDA") for cupti, e in enumerate(gemms, start=1)]
        # Each launch listed after the ops, as kineto lists the runtime's activities.
        self.kineto_results = SimpleNamespace(
            events=lambda: real_events + launches + kernels)

    @property
    def function_events(self) -> list[Any]:
        raise AssertionError("the raw events are read, not the profiler's tree")


@contextlib.contextmanager
def _cuda_profiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(_trace, "open_profiler", _FakeCudaProfiler)
    _FakeCudaProfiler.sessions = 0
    yield SimpleNamespace(type="cuda")


def test_on_cuda_the_ops_whose_kernel_is_chosen_carry_the_kernels_the_profiler_saw(
        monkeypatch) -> None:
    built = load_workload("mlp").build(dtype=torch.float32, device=CPU)
    x = next(iter(built.inputs.values()))
    with _cuda_profiler(monkeypatch) as cuda:
        session = _trace.KernelSession()
        with session.record(cuda):
            with _trace.tracing(built.model, session, "0") as tracer, torch.no_grad():
                built.model(x)
        session.annotate("0", tracer.ops)
    gemms = [op for op in tracer.ops if op["op"] == "aten.addmm.default"]
    assert gemms and all(op["kernel"] == TF32_GEMM for op in gemms)
    # An elementwise op's kernel is its own: not recorded (no annotation around it).
    assert all("kernel" not in op for op in tracer.ops if op["op"] != "aten.addmm.default")


def test_a_variants_traced_passes_share_one_profiler_session(monkeypatch) -> None:
    """One CUPTI initialisation per variant, not one per workload; and the traces are
    those of passes without a profiler, kernel names aside."""
    from numparity_agent import _runner

    plain = {name: run_workload(load_workload(name), variant=variant("default"), device=CPU,
                                repeats=1, trace=True)["trace"] for name in ("mlp", "cnn")}
    with _cuda_profiler(monkeypatch) as cuda:
        # The session opens as on CUDA; the passes compute on the CPU.
        record = _trace.KernelSession.record
        monkeypatch.setattr(_trace.KernelSession, "record",
                            lambda self, device: record(self, cuda))
        jobs: list[Any] = []
        results = [run_workload(load_workload(name), variant=variant("default"), device=CPU,
                                repeats=1, trace=True, trace_jobs=jobs)
                   for name in ("mlp", "cnn")]
        assert all("trace" not in result for result in results)  # not yet: one session
        _runner.run_traces(jobs)
    assert _FakeCudaProfiler.sessions == 1
    for name, result in zip(("mlp", "cnn"), results, strict=True):
        traced = result["trace"]
        gemms = [op for op in traced["ops"] if op["op"] == "aten.addmm.default"]
        assert gemms and all(TF32_GEMM in op["kernel"] for op in gemms)
        assert [{k: v for k, v in op.items() if k != "kernel" or "conv:" in v}
                for op in traced["ops"]] == [
            {k: v for k, v in op.items() if k != "kernel" or "conv:" in v}
            for op in plain[name]["ops"]]
        assert result["timeline"]["trace_s"] > 0


def test_deferred_hashes_give_the_trace_of_hashes_taken_at_once(monkeypatch) -> None:
    """The GPU path (copy without waiting, hash after the pass, PENDING_BYTES at a time),
    run on the CPU: the trace is the one of hashes taken as each op ran, in-place ops
    (Adam's steps) included."""
    at_once = _traced("train")["trace"]
    monkeypatch.setattr(_trace.OpTracer, "DEFERRED", frozenset({"cpu"}))
    monkeypatch.setattr(_trace, "PENDING_BYTES", 64 * 1024)  # several flushes a pass
    deferred = _traced("train")["trace"]
    assert deferred == at_once


# ---- the command line and the config -----------------------------------------------------


def test_run_trace_ops_puts_each_trace_once_in_the_document(tmp_path) -> None:
    from helpers.agent import clean_env, run_agent

    out = tmp_path / "run.json"
    proc = run_agent("run", "--workloads", "mlp", "probes", "--variants", "default", "strict",
                     "--repeats", "1", "--output", str(out),
                     env=clean_env(NUMPARITY_TRACE_OPS="yes"))
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    traces = {body["hash"]: body for body in document["traces"]}
    referenced = [r["trace"] for r in document["results"]]
    # default and strict compute alike on a CPU: one body for both, each body once.
    assert len(traces) == len(document["traces"]) == len(set(referenced)) == 2
    assert set(referenced) == set(traces)
    for result in document["results"]:
        outputs = {ref for op in traces[result["trace"]]["ops"] for ref in op["out"]}
        assert {t["hash"][:16] for t in result["tensors"] if t["kind"] == "output"} <= outputs


def test_trace_ops_is_a_flag_of_the_config_and_environment(tmp_path) -> None:
    from numparity_agent.testing import ConfigError, resolve_config

    config = tmp_path / "agent.toml"
    config.write_text("trace_ops = true\n")
    assert resolve_config({}, {}, str(config)).get("trace_ops") is True
    assert resolve_config({}, {"NUMPARITY_TRACE_OPS": "off"}, str(config)).get(
        "trace_ops") is False
    assert resolve_config({"trace_ops": True}, {"NUMPARITY_TRACE_OPS": "0"}).get("trace_ops")
    config.write_text('trace_ops = "sometimes"\n')
    with pytest.raises(ConfigError, match="trace_ops in .* must be true or false"):
        resolve_config({}, {}, str(config))


def test_views_compute_nothing_and_are_not_ops() -> None:
    result = _traced("cnn")
    ops = result["trace"]["ops"]
    assert not {"aten.view.default", "aten.t.default", "aten._unsafe_view.default"} & {
        op["op"] for op in ops}
    # The flattened activation is a view of pool2's output: no op of its own makes it,
    # and fc1's matmul reads its bytes.
    flatten = next(t for t in result["tensors"] if t["name"] == "flatten")
    assert not any(flatten["hash"][:16] in op["out"] for op in ops)
    assert any(flatten["hash"][:16] in op["in"] for op in ops if op["module"] == "fc1")


def test_a_drilled_bit_changes_between_ops_and_no_op_is_its_origin() -> None:
    clean = _traced("cnn", "strict")
    drilled = _traced("cnn", "strict", fault_drill=True)
    a, b = clean["trace"]["ops"], drilled["trace"]["ops"]
    # The drill's own arithmetic is not in the trace: the same ops, in the same order.
    assert [(op["op"], op["module"]) for op in a] == [(op["op"], op["module"]) for op in b]
    assert not [x for x, y in zip(a, b, strict=True)
                if x["in"] == y["in"] and x.get("args") == y.get("args") and x["out"] != y["out"]]
    # The first op that reads other bits reads the drilled layer's output (or a view of
    # it: cnn's flatten is one).
    names = [t["name"] for t in drilled["tensors"]]
    at = names.index(drilled["drill"]["layer"])
    flipped = {t["hash"][:16] for t in drilled["tensors"][at:at + 2]}
    first = next(y for x, y in zip(a, b, strict=True) if x["in"] != y["in"])
    assert flipped & set(first["in"]), (first, names[at:at + 2])
