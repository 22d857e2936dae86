"""`collectives`: the node's all-reduce, all-gather and reduce-scatter (design §2.2).

Each run starts one process per rank, as children of the variant's child, and runs the
three collectives through torch.distributed:
- on CUDA, NCCL over every visible CUDA device, rank r on cuda:r (world size = the
  visible device count), the ranks started by a forkserver (CUDA cannot be forked);
- on the CPU (and in `fp64-reference`, which always runs on the CPU), gloo over
  WORLD_CPU ranks on the loopback interface, the ranks forked (spawning four
  interpreters that import torch costs seconds; a fork costs milliseconds).

Rank r's input is LENGTH bell-shaped values from its own stream `input.rank<r>`, the
same on every node. The input hash covers ranks 0..INPUT_RANKS-1 whatever the world
size, so nodes with different device counts agree on their input bytes. The
collectives reduce in the variant's dtype, or in the autocast dtype under an autocast
variant (as mixed-precision training reduces gradients in bf16 or fp16).

Recorded (kind "output", rank 0's, `.w<world>` naming the world size, since a sum over 8
ranks is not comparable with one over 4): `all_reduce.w4` (the sum of every rank's
input), `all_gather.w4` (the first GATHER elements of each rank's input, concatenated)
and `reduce_scatter.w4` (rank 0's share of the sum of the inputs' first
world·(LENGTH // world) elements); the same of every other rank r,
`<collective>.w4.rank<r>`, then each collective's later repeats k of every rank,
`<collective>.w4[.rank<r>].repeat<k>` (version 2: a fault on rank r's device, in any
repeat, differs from the same rank and repeat of the peers). Result field "collectives":
the backend, world size and dtype; whether REPEATS repeats of each collective in each
rank were bitwise equal; whether every rank got the same all-reduce and all-gather;
whether every rank's
reduce-scatter equals its slice of the all-reduce; whether the all-gather is exactly
the inputs; the all-reduce's largest error against the float64 sum of the inputs (in
ULPs of its dtype from the correctly rounded sum, and absolute) and how many elements
are not the correctly rounded sum; the settings in force (NCCL_ALGO, NCCL_PROTO and the
NCCL version; gloo's interface). A collective this backend or torch cannot run in the
dtype is skipped with the reason (field "collectives": {"skipped": {...}}); on a device
type with neither backend, all three are.

A rank that fails, crashes or hangs fails the workload with what each rank said (a
crash or a missing answer first), within `timeout_s`; no rank outlives the run.

Under an op drill (`--fault-drill op:SPEC`, design §2.6) the ranks are one site of the
drill (`_inject.remote_site`): each rank installs the drill's dispatch mode around its
collectives (`c10d.allreduce_`, `c10d._allgather_base_`, `c10d._reduce_scatter_base_`,
as torch dispatches them; class `collective`) and reports its calls and flip; the
chosen rank corrupts the chosen element of the chosen collective's output on that rank
once the collective has returned it (`_inject.settle` after each call).
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import socket
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from numparity_agent._inject import (
    RemoteDrill,
    RemoteReport,
    member_drill,
    remote_site,
    settle,
)
from numparity_agent._workloads._base import (
    Built,
    Recorder,
    Workload,
    autocast_dtype,
    bell_tensor,
)

WORLD_CPU = 4  # gloo ranks on the CPU: fixed, so every node's answers are comparable
INPUT_RANKS = 8  # ranks whose inputs are built (and hashed), whatever the world size
LENGTH = 840 * 16  # elements per rank: 13440 splits evenly over 1-8, 10, 12, 14 ranks
GATHER = 1024  # elements each rank contributes to the all-gather
REPEATS = 3  # runs of each collective in each rank, compared bitwise
TIMEOUT_S = 120.0  # the whole run of the ranks: then they are killed
PROCESS_GROUP_SHARE = 0.75  # torch.distributed's own timeout, as a share of TIMEOUT_S
# After a rank fails, how long the others get to say what they saw before they are
# killed (a rank that crashes is usually seen after its peers' "connection closed").
FAILURE_GRACE_S = 1.0
NCCL_ENV = ("NCCL_ALGO", "NCCL_PROTO")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
# What gloo and NCCL say when they have no kernel for a dtype, or torch has no such
# collective for the backend (checked before any rank communicates, so every rank
# skips alike).
_UNSUPPORTED = re.compile(
    r"Invalid scalar type|[Uu]nsupported (data ?type|dtype)|does not support"
)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class CollectiveError(RuntimeError):
    """The ranks failed: which rank, and why, first (its cause: what every rank said)."""


class RankFailures(Exception):
    """What each failing rank said, with its traceback (the cause of a CollectiveError)."""


@dataclass(frozen=True)
class Plan:
    """How the collectives run for a device: the torch.distributed backend, world size,
    how the rank processes start and the settings in force."""

    backend: str
    world: int
    start_method: str
    settings: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)  # set in each rank before init


def plan_for(device: torch.device) -> Plan | str:
    """The plan for `device`, or why the collectives cannot run there."""
    if not dist.is_available():
        return f"torch {torch.__version__} has no torch.distributed"
    if device.type == "cuda":
        if not dist.is_nccl_available():
            return f"torch {torch.__version__} has no NCCL"
        settings: dict[str, Any] = {name: os.environ.get(name) for name in NCCL_ENV}
        settings["nccl_version"] = _nccl_version()
        return Plan("nccl", torch.cuda.device_count(), _start_method(fork=False), settings)
    if device.type == "cpu":
        if not dist.is_gloo_available():
            return f"torch {torch.__version__} has no gloo"
        loopback = _loopback_interface()
        env = {"GLOO_SOCKET_IFNAME": loopback} if loopback else {}
        return Plan(
            "gloo", WORLD_CPU, _start_method(fork=True), {"GLOO_SOCKET_IFNAME": loopback}, env
        )
    return f"no torch.distributed backend for device type {device.type} (NCCL: cuda, gloo: cpu)"


def _nccl_version() -> str:
    version = torch.cuda.nccl.version()
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version)


def _start_method(*, fork: bool) -> str:
    """fork where it is safe and cheap (the CPU ranks, on Linux); else a forkserver,
    which imports torch once per variant child and never initialises CUDA; else spawn."""
    available = multiprocessing.get_all_start_methods()
    if fork and sys.platform == "linux" and "fork" in available:
        return "fork"
    return "forkserver" if "forkserver" in available else "spawn"


def _loopback_interface() -> str | None:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS), None if unknown:
    gloo otherwise binds the address the host name resolves to."""
    try:
        names = {name for _index, name in socket.if_nameindex()}
    except OSError:
        return None
    return next((name for name in ("lo", "lo0") if name in names), None)


class Collectives(Workload):
    name = "collectives"
    version = 2  # 2: every rank's answers recorded, not rank 0's alone
    timeout_s = TIMEOUT_S
    traceable = False  # its work runs in the ranks' processes
    compilable = False  # no model: collectives in the ranks

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        inputs = {f"rank{r}": self._rank_input(r, dtype, device) for r in range(INPUT_RANKS)}
        return Built(model=nn.Module().to(device), inputs=inputs)

    def _rank_input(self, rank: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return bell_tensor(self, f"input.rank{rank}", (LENGTH,)).to(dtype).to(device)

    def run(self, built: Built, recorder: Recorder) -> None:
        first = built.inputs["rank0"]
        plan = plan_for(first.device)
        if isinstance(plan, str):
            recorder.fields["collectives"] = {"skipped": dict.fromkeys(COLLECTIVES, plan)}
            return
        dtype = autocast_dtype(first.device.type) or first.dtype
        inputs = [
            built.inputs[f"rank{r}"] if r < INPUT_RANKS
            else self._rank_input(r, first.dtype, first.device)
            for r in range(plan.world)
        ]
        site = remote_site("rank")
        drills = [site.member(rank) for rank in range(plan.world)] if site else None
        answers = run_ranks(plan, [x.cpu().numpy() for x in inputs], dtype, self.timeout_s,
                            drills)
        if site is not None:
            site.absorb([answer.drill for answer in answers])
        record_answers(recorder, plan, inputs, dtype, answers)


# --- the ranks ----------------------------------------------------------------------


@dataclass(frozen=True)
class RankTask:
    """What one rank process needs (pickled for a forkserver or spawn start)."""

    rank: int
    plan: Plan
    dtype: str  # the collectives' dtype, e.g. "bfloat16"
    data: np.ndarray  # this rank's input in the variant's dtype (float32 or float64)
    store: str  # the FileStore path the ranks meet at
    timeout_s: float
    drill: RemoteDrill | None = None  # the op drill's part in this rank (`_inject`)


@dataclass
class RankAnswer:
    """One rank's results, as raw bits (numpy has no bfloat16), and what it saw."""

    bits: dict[str, np.ndarray]
    repeats_differ: list[str]
    skipped: dict[str, str]
    drill: RemoteReport | None = None  # the op drill's calls and flip in this rank
    # Each collective's later repeats (REPEATS - 1 of them), as raw bits.
    repeat_bits: dict[str, list[np.ndarray]] = field(default_factory=dict)


def rank_main(task: RankTask, conn: Connection) -> None:
    """A rank process: run the collectives and send ("ok", RankAnswer, when) or
    ("error", traceback, when) to the parent; `when` is time.monotonic(), one clock for
    every process of the machine, so the parent can tell which rank failed first."""
    try:
        answer = _rank_answer(task)
    except BaseException:
        when = time.monotonic()
        conn.send(("error", traceback.format_exc(), when))
        conn.close()
        raise SystemExit(1) from None
    conn.send(("ok", answer, time.monotonic()))
    conn.close()


def _rank_answer(task: RankTask) -> RankAnswer:
    # A forked rank inherits the parent's dispatch modes: dropped, and the rank's own
    # part of an op drill installed instead.
    with member_drill(task.drill) as drill:
        answer = _rank_run(task)
    answer.drill = drill.report()
    return answer


def _rank_run(task: RankTask) -> RankAnswer:
    _die_with_parent()
    os.environ.update(task.plan.env)
    # One thread: a forked rank must not touch the parent's OpenMP pool, and gloo's
    # reductions do not use it.
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if task.plan.backend == "nccl":
        device = torch.device("cuda", task.rank)
        torch.cuda.set_device(device)
    dist.init_process_group(
        task.plan.backend,
        init_method=f"file://{task.store}",
        rank=task.rank,
        world_size=task.plan.world,
        # Shorter than the parent's deadline, so the ranks still waiting on a hung
        # peer say so themselves before they are killed.
        timeout=timedelta(seconds=task.timeout_s * PROCESS_GROUP_SHARE),
    )
    answer = _collectives(task, device)
    # Only after a success: on an error the peers must not see this rank leave (and
    # report "connection closed") before it has said what went wrong.
    dist.destroy_process_group()
    return answer


def _die_with_parent() -> None:
    """On Linux, have the kernel kill this rank when the process that started it dies:
    a variant child killed at its own timeout leaves no rank behind, even one stuck in
    NCCL. (A forkserver's ranks go with the forkserver, which ends with its parent.)"""
    if sys.platform != "linux":
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _collectives(task: RankTask, device: torch.device) -> RankAnswer:
    world = task.plan.world
    x = torch.from_numpy(task.data).to(getattr(torch, task.dtype)).to(device)
    share = x.numel() // world
    # torch 2.13 renamed the single-tensor forms; the old names exist since 1.13.
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    # `settle`: an op drill's flip of a collective's output waits until the collective
    # has returned its answer (see `_inject.OpDrill.settle`).
    def all_reduce() -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out)
        settle()
        return out

    def gather() -> torch.Tensor:
        out = x.new_empty(world * GATHER)
        all_gather(out, x[:GATHER].contiguous())
        settle()
        return out

    def scatter() -> torch.Tensor:
        out = x.new_empty(share)
        reduce_scatter(out, x[: world * share].contiguous())
        settle()
        return out

    ops: dict[str, Callable[[], torch.Tensor]] = {
        "all_reduce": all_reduce, "all_gather": gather, "reduce_scatter": scatter,
    }
    answer = RankAnswer(bits={}, repeats_differ=[], skipped={})
    for name, op in ops.items():
        try:
            first = op()
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            if not _UNSUPPORTED.search(message):
                raise
            answer.skipped[name] = (
                f"{task.plan.backend} on torch {torch.__version__} cannot {name} "
                f"{task.dtype}: {message}"
            )
            continue
        bits = _bits(first)
        # Every repeat runs, even after one differs: a rank that stopped early would
        # leave its peers waiting in the next collective.
        repeats = [_bits(op()) for _ in range(REPEATS - 1)]
        if not all(torch.equal(repeat, bits) for repeat in repeats):
            answer.repeats_differ.append(name)
        answer.bits[name] = bits.cpu().numpy()
        answer.repeat_bits[name] = [repeat.cpu().numpy() for repeat in repeats]
    return answer


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers of its size (compared exactly, NaN or not)."""
    return t.detach().contiguous().view(_INT_OF_SIZE[t.element_size()])


def run_ranks(
    plan: Plan, inputs: list[np.ndarray], dtype: torch.dtype, timeout_s: float,
    drills: list[RemoteDrill] | None = None,
) -> list[RankAnswer]:
    """Every rank's answer, in rank order; CollectiveError when a rank fails, crashes
    or does not answer within `timeout_s` (the others are then killed). `drills`: each
    rank's part of an op drill."""
    context: Any = multiprocessing.get_context(plan.start_method)  # its Process is untyped
    if plan.start_method == "forkserver":
        # The server imports torch (and this module) once; each rank is a fork of it.
        context.set_forkserver_preload([__name__])
    dtype_name = str(dtype).removeprefix("torch.")
    procs: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="numparity-collectives-") as tmp:
        store = os.path.join(tmp, "store")
        pending: dict[Connection, int] = {}
        try:
            for rank in range(plan.world):
                receive, send = context.Pipe(duplex=False)
                task = RankTask(rank, plan, dtype_name, inputs[rank], store, timeout_s,
                                drills[rank] if drills else None)
                proc = context.Process(
                    target=rank_main, args=(task, send), name=f"numparity-rank{rank}",
                    daemon=True,
                )
                with warnings.catch_warnings():
                    # Python 3.12+ warns that forking a threaded process may deadlock
                    # the child; a rank only runs gloo, on one torch thread.
                    warnings.simplefilter("ignore", DeprecationWarning)
                    proc.start()
                send.close()
                procs.append(proc)
                pending[receive] = rank
            said = _gather(procs, pending, deadline=time.monotonic() + timeout_s)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
            for proc in procs:
                proc.join()
    failures = _failures(procs, said, timeout_s)
    if failures:
        raise _failure_error(plan, failures)
    return [said[rank][1] for rank in range(plan.world)]


def _gather(
    procs: list[Any], pending: dict[Connection, int], *, deadline: float
) -> dict[int, tuple[str, Any, float]]:
    """What each rank sent, until all have answered, the deadline passes or, once one
    has failed, FAILURE_GRACE_S more. A rank that exits without a word shows as its
    pipe's end of file."""
    said: dict[int, tuple[str, Any, float]] = {}
    while pending:
        now = time.monotonic()
        if now >= deadline:
            break
        ready = multiprocessing.connection.wait(list(pending), timeout=deadline - now)
        for conn in ready:
            assert isinstance(conn, Connection)
            rank = pending.pop(conn)
            try:
                said[rank] = conn.recv()
            except EOFError:
                said[rank] = ("died", None, time.monotonic())
            if said[rank][0] != "ok":
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
    return said


@dataclass(frozen=True)
class _Failure:
    rank: int
    headline: str  # one line
    traceback: str = ""


def _failures(
    procs: list[Any], said: dict[int, tuple[str, Any, float]], timeout_s: float
) -> list[_Failure]:
    """Each rank that did not answer ok, the likely cause first: ranks that died, then
    ranks that never answered (a hung rank, while its peers time out), then the ranks'
    own errors in the order they happened (after a peer's failure, the others only see
    "connection closed")."""
    died, silent, errors = [], [], []
    failed = any(status != "ok" for status, _payload, _when in said.values())
    for rank, proc in enumerate(procs):
        status, payload, when = said.get(rank, ("silent", None, 0.0))
        if status == "died":
            died.append(_Failure(rank, f"rank {rank} {_exit_text(proc.exitcode)} without an "
                                       "answer"))
        elif status == "silent" and failed:
            silent.append(_Failure(rank, f"rank {rank} had not answered {FAILURE_GRACE_S:g} s "
                                         "after another rank failed (killed)"))
        elif status == "silent":
            silent.append(_Failure(rank, f"rank {rank} did not answer within {timeout_s:g} s "
                                         "(killed)"))
        elif status == "error":
            lines = str(payload).strip().splitlines()
            last = lines[-1] if lines else "error"
            errors.append((when, _Failure(rank, f"rank {rank}: {last}", str(payload))))
    return died + silent + [failure for _when, failure in sorted(errors, key=lambda e: e[0])]


def _failure_error(plan: Plan, failures: list[_Failure]) -> CollectiveError:
    """One line naming the likely cause and the other failing ranks; its cause holds
    each rank's line and the first error's traceback."""
    first, rest = failures[0], failures[1:]
    after = ""
    if rest:
        ranks = ", ".join(str(f.rank) for f in sorted(rest, key=lambda f: f.rank))
        after = f" (rank{'s' if len(rest) > 1 else ''} {ranks} failed too)"
    error = CollectiveError(
        f"collectives over {plan.world} {plan.backend} ranks failed: {first.headline}{after}"
    )
    details = [first.headline, first.traceback.rstrip(), *(f.headline for f in rest)]
    error.__cause__ = RankFailures("\n".join(line for line in details if line))
    return error


def _exit_text(code: int | None) -> str:
    if code is None:
        return "stopped"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# --- what is recorded ---------------------------------------------------------------


def record_answers(
    recorder: Recorder,
    plan: Plan,
    inputs: list[torch.Tensor],
    dtype: torch.dtype,
    answers: list[RankAnswer],
) -> None:
    """Record every rank's results (rank 0's first) and the field "collectives" (see the
    module docstring)."""
    world = plan.world
    skipped = answers[0].skipped
    if any(answer.skipped.keys() != skipped.keys() for answer in answers):
        raise CollectiveError("the ranks disagree on which collectives they can run")
    results = [
        {name: torch.from_numpy(bits).view(dtype) for name, bits in answer.bits.items()}
        for answer in answers
    ]
    # Every rank's answers and every repeat's (version 2), rank 0's first answers first:
    # a rank whose device computes wrong, once or every time, differs from the same
    # rank and repeat on the peers, not only in the ranks' own agreement.
    for rank, result in enumerate(results):
        for name in COLLECTIVES:
            if name in result:
                recorder.record(f"{name}.w{world}" + (f".rank{rank}" if rank else ""),
                                "output", result[name])
    for rank, answer in enumerate(answers):
        for name in COLLECTIVES:
            for k, bits in enumerate(answer.repeat_bits.get(name, []), start=1):
                recorder.record(f"{name}.w{world}" + (f".rank{rank}" if rank else "")
                                + f".repeat{k}", "output", torch.from_numpy(bits).view(dtype))
    xs = [x.detach().cpu().to(dtype) for x in inputs]
    fields: dict[str, Any] = {
        "backend": plan.backend,
        "world_size": world,
        "dtype": str(dtype).removeprefix("torch."),
        "repeats": REPEATS,
        "repeats_agree": not any(answer.repeats_differ for answer in answers),
        "ranks_agree": all(
            torch.equal(_bits(result[name]), _bits(results[0][name]))
            for result in results
            for name in ("all_reduce", "all_gather")
            if name in results[0]
        ),
        "settings": plan.settings,
    }
    differing = sorted({name for answer in answers for name in answer.repeats_differ})
    if differing:
        fields["repeats_differ"] = differing
    if "all_reduce" in results[0]:
        fields.update(all_reduce_error(results[0]["all_reduce"], xs))
    if "all_gather" in results[0]:
        expected = torch.cat([x[:GATHER] for x in xs])
        fields["all_gather_exact"] = all(
            torch.equal(_bits(result["all_gather"]), _bits(expected)) for result in results
        )
    if "all_reduce" in results[0] and "reduce_scatter" in results[0]:
        share = LENGTH // world
        total = results[0]["all_reduce"]
        fields["reduce_scatter_matches_all_reduce"] = all(
            torch.equal(
                _bits(result["reduce_scatter"]), _bits(total[rank * share : (rank + 1) * share])
            )
            for rank, result in enumerate(results)
        )
    if skipped:
        fields["skipped"] = dict(skipped)
    recorder.fields["collectives"] = fields


def all_reduce_error(result: torch.Tensor, inputs: list[torch.Tensor]) -> dict[str, Any]:
    """The all-reduce against the float64 sum of `inputs` (numpy): the largest distance
    in ULPs of the result's dtype from that sum correctly rounded to the dtype, the
    largest absolute error, and how many elements are not the correctly rounded sum."""
    exact = np.sum(np.stack([x.double().numpy() for x in inputs]), axis=0)
    rounded = torch.from_numpy(round_to(exact, result.dtype)).to(result.dtype)
    ulps = (_ordered(result) - _ordered(rounded)).abs()
    error = np.abs(result.double().numpy() - exact)
    return {
        "all_reduce_max_ulp": int(ulps.max()),
        "all_reduce_max_abs_error": float(error.max()),
        "all_reduce_not_correctly_rounded": int((ulps != 0).sum()),
    }


def round_to(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """float64 `values` rounded once to nearest-even at `dtype`'s precision (subnormals
    included; no overflow), still in float64. A direct float64 -> bfloat16 conversion
    goes through float32 and can round twice."""
    finfo = torch.finfo(dtype)
    fraction_bits = round(-math.log2(finfo.eps))
    min_exponent = round(math.log2(finfo.tiny))
    _mantissa, exponent = np.frexp(values)  # values = mantissa * 2**exponent, |m| in [.5, 1)
    quantum = np.ldexp(1.0, np.maximum(exponent - 1, min_exponent) - fraction_bits)
    return np.rint(values / quantum) * quantum  # scaling by powers of two is exact


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Floats (sign and magnitude) as int64 in the same order, one apart per ULP."""
    bits = _bits(t).to(torch.int64)
    magnitude = bits & ((1 << (8 * t.element_size() - 1)) - 1)
    return torch.where(bits < 0, -magnitude, magnitude)
