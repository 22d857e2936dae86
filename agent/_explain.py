"""`numparity-agent explain --against RUN_ID` (design §2.11): the setting under which
this node gives another run's bits; with `--target eager`, the Inductor setting under
which this node's compiled results give the same run's eager bits.

The server says *that* two environments differ and at which op; a lab engineer asks
next which setting makes them agree. `explain` finds out on the node itself: it reads
what it needs of the reference run (each result's tensor hashes and the run's numeric
environment: `GET /api/v1/agent/reference/{run_id}`, an agent route that reveals
nothing else), runs the workloads that differ in child processes under candidate
settings, and reports the first setting under which every tensor of a result is the
reference's, bit for bit; else the closest one. Candidates, cheapest and likeliest
first (`candidates`): the settings in which the two environments differ (the reference's
environment variables, thread count and knobs), then every other setting that applies to
the device one at a time (in-process knobs before variables that need a new process),
then pairs; bounded by `max_candidates` and `max_seconds`. A child runs one variant
under one set of environment variables and tries every knob set of that group in turn
(`_explain_child`). Findings go to `POST /api/v1/explanations`, where the server shows
them beside the split.

The eager target (`eager_targets_of`, design §2.14): each compiled result of the run is
to give the run's `default` answer of the same workload on the same device. Only
settings that change nothing but what Inductor compiles are candidates (an eager knob
would move eager's answer too), and this node's eager answer must still be the run's:
else no compiled answer could be "eager's", and the finding says so.

This module does not import torch.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from numparity_agent import _compile, _variants, _workloads
from numparity_agent._answer import ServerAnswer, answer_of, no_answer
from numparity_agent._log import log
from numparity_agent._settings import (
    ENV_CHOICES,
    INDUCTOR_PREFIX,
    KNOB_CHOICES,
    Setting,
    applies,
)

SCHEMA = "numparity.explain/v1"
REFERENCE_PATH = "/api/v1/agent/reference/{run_id}"
EXPLANATIONS_PATH = "/api/v1/explanations"
DEFAULT_MAX_CANDIDATES = 40
DEFAULT_MAX_SECONDS = 110.0
# A child gets the time left, but never less than this (torch's import alone is ~1.5 s).
MIN_CHILD_TIMEOUT_S = 30.0
NO_SETTING = Setting()
# What a finding's reference is: another run's result, or the same run's eager answer.
TARGET_RUN, TARGET_EAGER = "run", "eager"
TARGETS = (TARGET_RUN, TARGET_EAGER)
# The variant whose answer is eager's (the server's `compiled.service.EAGER_VARIANT`).
EAGER_VARIANT = "default"
# Labels of the settings tried that a sentence names before "and N more".
TRIED_NAMED = 12


class ExplainError(RuntimeError):
    """The reference cannot be used (no such run, no result of what was asked)."""


@dataclass(frozen=True)
class Target:
    """One result of the reference run that this node should reproduce."""

    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str  # the reference's device
    tensors: tuple[tuple[str, str], ...]
    input_hash: str | None = None
    param_hash: str | None = None
    # TARGET_EAGER: `tensors` are the same run's eager (default) answer on `device`.
    kind: str = TARGET_RUN

    @property
    def key(self) -> tuple[str, str]:
        return self.workload, self.variant


# `detail` and child errors stay within what the server stores (16,384 characters).
DETAIL_LIMIT = 4000


@dataclass
class Finding:
    target: Target
    status: str = "not_reproduced"  # reproduced | already | not_reproduced | failed
    setting: Setting | None = None
    tried: int = 0
    seconds: float = 0.0
    closest: dict[str, Any] | None = None
    detail: str | None = None
    # The labels of the settings tried, in order (the eager target's sentence names them).
    tried_labels: list[str] = field(default_factory=list, repr=False)
    _closest_score: tuple[int, int] = field(default=(-1, -1), repr=False)

    def to_json(self) -> dict[str, Any]:
        t = self.target
        return {
            "suite": t.suite, "workload": t.workload, "workload_version": t.workload_version,
            "variant": t.variant, "device": t.device, "status": self.status,
            "setting": self.setting.to_json() if self.setting is not None else None,
            "label": self.setting.label() if self.setting is not None else None,
            "tried": self.tried, "seconds": round(self.seconds, 3),
            "closest": self.closest,
            "detail": self.detail[-DETAIL_LIMIT:] if self.detail else self.detail,
        }

    def sentence(self, against: str) -> str:
        if self.target.kind == TARGET_EAGER:
            return self._eager_sentence(against)
        what = f"{self.target.workload}/{self.target.variant}"
        if self.status == "already":
            return f"{what}: this node already gives run {against}'s bits"
        if self.status == "reproduced" and self.setting is not None:
            return (f"{what}: this node gives run {against}'s bits with "
                    f"{self.setting.label()} (tried {self.tried} setting(s) in "
                    f"{self.seconds:.1f} s)")
        if self.status == "failed":
            return f"{what}: cannot tell: {self.detail}"
        closest = ""
        if self.closest is not None:
            closest = (f"; closest: {self.closest['label']} ({self.closest['matching']} of "
                       f"{self.closest['tensors']} tensors the same"
                       + (f", first differing {self.closest['first_differing']}"
                          if self.closest.get("first_differing") else "") + ")")
        return (f"{what}: no single setting or pair reproduces run {against}'s bits "
                f"(tried {self.tried} in {self.seconds:.1f} s){closest}")

    def _closest_text(self) -> str:
        if self.closest is None:
            return ""
        return (f"; closest: {self.closest['label']} ({self.closest['matching']} of "
                f"{self.closest['tensors']} tensors the same"
                + (f", first differing {self.closest['first_differing']}"
                   if self.closest.get("first_differing") else "") + ")")

    def _eager_sentence(self, against: str) -> str:
        what = f"{self.target.workload}/{self.target.variant}"
        eager = f"eager's bits (run {against}'s {EAGER_VARIANT} result)"
        if self.status == "already":
            return f"{what}: already gives {eager} as configured"
        if self.status == "reproduced" and self.setting is not None:
            return (f"{what}: {eager} restored by {self.setting.label()} (tried "
                    f"{self.tried} setting(s) in {self.seconds:.1f} s)")
        if self.status == "failed":
            return f"{what}: cannot tell: {self.detail}"
        named = self.tried_labels[:TRIED_NAMED]
        more = len(self.tried_labels) - len(named)
        tried = "; ".join(named) + (f"; and {more} more" if more > 0 else "")
        return (f"{what}: no candidate restores {eager} (tried {self.tried} in "
                f"{self.seconds:.1f} s: {tried or 'none'}){self._closest_text()}")


def targets_of(reference: dict[str, Any], *, workloads: Sequence[str] | None,
               variants: Sequence[str] | None, device: str | None) -> list[Target]:
    """The reference's ok results to reproduce: of `workloads` and `variants` (default
    every one but the float64 reference), on `device` (default each result's first
    device in the reference)."""
    chosen: dict[tuple[str, str], Target] = {}
    for result in reference.get("results") or []:
        if result.get("status", "ok") != "ok":
            continue
        if result.get("suite", _workloads.SUITE) != _workloads.SUITE:
            # Its child loads the standard suite's definitions (design §2.11).
            raise ExplainError(f"run {reference.get('run_id')} is of suite "
                               f"{result['suite']}: explain reproduces {_workloads.SUITE} "
                               "runs only")
        workload, variant = result["workload"], result["variant"]
        if workloads and workload not in workloads:
            continue
        if variants and variant not in variants:
            continue
        if not variants and _variants.VARIANTS.get(variant, _variants.Default()).cpu_only:
            continue
        if device is not None and result["device"] != device:
            continue
        if variant not in _variants.VARIANTS or (workload, variant) in chosen:
            continue
        chosen[(workload, variant)] = Target(
            suite=result.get("suite", "standard"), workload=workload,
            workload_version=result.get("workload_version"), variant=variant,
            device=result["device"],
            tensors=tuple((t["name"], t["hash"]) for t in result["tensors"]),
            input_hash=result.get("input_hash"), param_hash=result.get("param_hash"))
    if not chosen:
        asked = ", ".join(f"{name} {', '.join(values)}" for name, values in
                          (("workloads", workloads or ()), ("variants", variants or ()),
                           ("device", [device] if device else ())) if values)
        raise ExplainError(f"run {reference.get('run_id')} has no ok result"
                           + (f" of {asked}" if asked else ""))
    return list(chosen.values())


def eager_targets_of(reference: dict[str, Any], *, workloads: Sequence[str] | None,
                     variants: Sequence[str] | None) -> list[Target]:
    """The reference's ok results of a compiling variant (`variants`, default every one
    the run has), each to give the same run's ok `default` answer of its workload on its
    device (the eager answer, design §2.14); of `workloads` when given."""
    results = [r for r in reference.get("results") or [] if r.get("status", "ok") == "ok"]
    eager = {(r.get("suite", _workloads.SUITE), r["workload"], r["device"]): r
             for r in results if r["variant"] == EAGER_VARIANT}
    chosen: dict[tuple[str, str, str], Target] = {}
    for result in results:
        workload, variant = result["workload"], result["variant"]
        suite = result.get("suite", _workloads.SUITE)
        chosen_variant = _variants.VARIANTS.get(variant)
        if chosen_variant is None or not chosen_variant.compiles:
            continue
        if workloads and workload not in workloads or variants and variant not in variants:
            continue
        answer = eager.get((suite, workload, result["device"]))
        if answer is None or (workload, variant, result["device"]) in chosen:
            continue
        if suite != _workloads.SUITE:
            raise ExplainError(f"run {reference.get('run_id')} is of suite {suite}: "
                               f"explain reproduces {_workloads.SUITE} runs only")
        chosen[(workload, variant, result["device"])] = Target(
            suite=suite, workload=workload, workload_version=result.get("workload_version"),
            variant=variant, device=result["device"],
            tensors=tuple((t["name"], t["hash"]) for t in answer["tensors"]),
            input_hash=answer.get("input_hash"), param_hash=answer.get("param_hash"),
            kind=TARGET_EAGER)
    if not chosen:
        asked = f" of {', '.join(workloads)}" if workloads else ""
        raise ExplainError(
            f"run {reference.get('run_id')} has no ok compiled result{asked} beside an ok "
            f"{EAGER_VARIANT} result on the same device: run the agent with --variants "
            f"{EAGER_VARIANT} {_variants.COMPILED_VARIANT}")
    return list(chosen.values())


# ---- candidates -----------------------------------------------------------------------


def _thread_count(environment: dict[str, Any]) -> int | None:
    threads = environment.get("threads") or {}
    value = threads.get("num_threads") if isinstance(threads, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# torch >= 2.9's fp32_precision tree and the legacy TF32 flags: once the new one is used,
# the legacy getters raise (`_knobs`), so a candidate sets the API the node's torch has.
_NEW_TF32 = ("cuda.matmul.fp32_precision", "cudnn.conv.fp32_precision")
_LEGACY_TF32 = ("cuda.matmul.allow_tf32", "cudnn.allow_tf32")


def _other_tf32_api(local_env: dict[str, Any]) -> tuple[str, ...]:
    """The TF32 knobs of the API this node's torch does not use."""
    return _LEGACY_TF32 if _NEW_TF32[0] in (local_env.get("knobs") or {}) else _NEW_TF32


def derived(reference_env: dict[str, Any], local_env: dict[str, Any],
            device_type: str) -> list[Setting]:
    """The settings in which the two environments differ, each alone: the reference's
    value of each numeric variable (unset where it has none), its thread count, its
    knobs. These are the likeliest causes, so they are tried first."""
    found: list[Setting] = []
    ref_vars = reference_env.get("env_vars") or {}
    local_vars = local_env.get("env_vars") or {}
    for name, _devices, _values in ENV_CHOICES:
        value = ref_vars.get(name)
        if value != local_vars.get(name) and applies(name, value, device_type):
            found.append(Setting.of(env={name: value}))
    ref_threads, local_threads = _thread_count(reference_env), _thread_count(local_env)
    if ref_threads is not None and ref_threads != local_threads and \
            applies("threads", ref_threads, device_type):
        found.append(Setting.of(knobs={"threads": ref_threads}))
    ref_knobs = reference_env.get("knobs") or {}
    local_knobs = local_env.get("knobs") or {}
    for name, _devices, _values in KNOB_CHOICES:
        if name in ("threads", "sdpa", *_other_tf32_api(local_env)) or name not in ref_knobs:
            continue
        value = ref_knobs[name]
        if value != local_knobs.get(name) and value is not None and \
                applies(name, value, device_type):
            found.append(Setting.of(knobs={name: value}))
    return found


def generic(local_env: dict[str, Any], device_type: str, *,
            compiler: bool = False) -> list[Setting]:
    """Every other setting that applies to the device, one at a time: knobs first (tried
    in the same child), then environment variables (a child each). Inductor's settings
    only with `compiler` (a compiled target), and then first: they are what a compiled
    split most likely comes from (design §2.14)."""
    local_vars = local_env.get("env_vars") or {}
    local_knobs = local_env.get("knobs") or {}
    cpus = (local_env.get("cpu") or {}).get("logical_cpus")
    found: list[Setting] = []
    knobs = sorted(KNOB_CHOICES, key=lambda choice: not choice[0].startswith(INDUCTOR_PREFIX))
    for name, _devices, values in knobs:
        if name in _other_tf32_api(local_env):
            continue
        if name.startswith(INDUCTOR_PREFIX) and not compiler:
            continue
        if name == "threads":
            values = tuple(dict.fromkeys(v for v in (1, 2, 4, cpus) if isinstance(v, int)))
            current = _thread_count(local_env)
        else:
            current = local_knobs.get(name)
        for value in values:
            if value != current and applies(name, value, device_type):
                found.append(Setting.of(knobs={name: value}))
    mkl = ((local_env.get("torch") or {}).get("mkl_available") is not False)
    for name, _devices, values in ENV_CHOICES:
        if name == "MKL_CBWR" and not mkl:
            continue
        for value in (*values, None):
            if value != local_vars.get(name) and applies(name, value, device_type):
                found.append(Setting.of(env={name: value}))
    return found


def candidates(reference_env: dict[str, Any], local_env: dict[str, Any], device_type: str,
               *, limit: int, compiler: bool = False) -> list[Setting]:
    """Singles (the differences first, then the rest), then pairs of singles (in the
    order of their members), at most `limit`, never the node as configured; Inductor's
    settings with `compiler` only (`generic`)."""
    return _with_pairs([*derived(reference_env, local_env, device_type),
                        *generic(local_env, device_type, compiler=compiler)], limit)


def eager_candidates(local_env: dict[str, Any], device_type: str, *,
                     limit: int) -> list[Setting]:
    """The eager target's candidates: Inductor's settings only, singles then pairs. Any
    other knob or variable moves eager's answer as well as the compiled one, so it
    cannot say which compiled setting gives eager's bits."""
    return _with_pairs([s for s in generic(local_env, device_type, compiler=True)
                        if s.compiler_only], limit)


def _with_pairs(found: Sequence[Setting], limit: int) -> list[Setting]:
    singles = list(dict.fromkeys(found))
    ranked: list[tuple[int, int, Setting]] = []
    for (i, a), (j, b) in itertools.combinations(enumerate(singles), 2):
        pair = a.combined(b)
        if pair is not None:
            ranked.append((i + j, i, pair))
    pairs = [pair for _rank, _i, pair in sorted(ranked, key=lambda r: (r[0], r[1]))]
    return list(dict.fromkeys([*singles, *pairs]))[:limit]


# ---- evaluation -------------------------------------------------------------------------

Runner = Callable[[Setting, str, list[str], list[Setting], dict[str, list[list[str]]], float],
                  dict[str, Any]]


def run_explain_child(env_setting: Setting, variant: str, workloads: list[str],
                      knob_sets: list[Setting], stop_when: dict[str, list[list[str]]],
                      timeout: float, *, device: str = "cpu",
                      compile_cache: Path | None = None) -> dict[str, Any]:
    """One `_explain_child` with `env_setting`'s variables: {"environment",
    "evaluations"}, or {"error": why} when it crashed or timed out. `compile_cache`:
    Inductor's cache folder for a compiling variant (the node's `compile_cache`
    setting; default the state folder's)."""
    spec = {"variant": variant, "workloads": workloads, "device": device,
            "candidates": [dict(s.knobs) for s in knob_sets], "stop_when": stop_when}
    chosen = _variants.get(variant)
    environ = env_setting.environ(chosen.child_env(dict(os.environ)))
    if chosen.compiles:
        environ = _compile.cache_environ(
            environ, compile_cache or _compile.default_cache_dir(environ))
    with tempfile.TemporaryDirectory(prefix="numparity-explain-") as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        cmd = [sys.executable, "-m", "numparity_agent._explain_child", spec_path, out_path]
        try:
            proc = subprocess.run(cmd, env=environ, timeout=timeout, capture_output=True,
                                  text=True, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        if proc.returncode != 0 or not os.path.exists(out_path):
            tail = (proc.stderr or "").strip().splitlines()[-1:] or [""]
            return {"error": f"child exited with code {proc.returncode}: "
                             f"{tail[0][-DETAIL_LIMIT:]}"}
        with open(out_path, encoding="utf-8") as f:
            output: dict[str, Any] = json.load(f)
        return output


def _score(tensors: Sequence[Sequence[str]], wanted: Sequence[tuple[str, str]]
           ) -> tuple[int, int, str | None]:
    """(tensors the same, position of the first that is not, its name)."""
    got = {name: digest for name, digest in tensors}
    same = sum(1 for name, digest in wanted if got.get(name) == digest)
    first = next(((i, name) for i, (name, digest) in enumerate(wanted)
                  if got.get(name) != digest), (len(wanted), None))
    return same, first[0], first[1]


@dataclass(frozen=True)
class Explained:
    findings: list[Finding]
    env_key: str | None  # of the environment the children computed in, as configured


def explain(
    reference: dict[str, Any], targets: Sequence[Target], *, device: str = "cpu",
    max_candidates: int = DEFAULT_MAX_CANDIDATES, max_seconds: float = DEFAULT_MAX_SECONDS,
    log_line: Callable[[str], None] = log, runner: Runner | None = None,
    compile_cache: Path | None = None,
) -> Explained:
    """A finding per target (see the module docstring), and the env_key of the node as
    it is configured here. `runner` runs one child (tests replace it); by default
    `run_explain_child` on `device`."""
    def default_runner(env_setting: Setting, variant: str, workloads: list[str],
                       knob_sets: list[Setting], stop_when: dict[str, list[list[str]]],
                       timeout: float) -> dict[str, Any]:
        return run_explain_child(env_setting, variant, workloads, knob_sets, stop_when,
                                 timeout, device=device, compile_cache=compile_cache)

    run = runner or default_runner
    started = time.monotonic()
    findings = {t.key: Finding(target=t) for t in targets}
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    by_variant: dict[str, list[Target]] = {}
    for target in targets:
        by_variant.setdefault(target.variant, []).append(target)

    def left() -> float:
        return max_seconds - (time.monotonic() - started)

    def settle(output: dict[str, Any], variant: str, sets: list[Setting]) -> None:
        for evaluation in output.get("evaluations") or []:
            finding = findings.get((evaluation["workload"], variant))
            if finding is None or finding.status in ("reproduced", "already", "failed"):
                continue
            setting = sets[evaluation["candidate"]]
            if setting.size:
                finding.tried += 1
                finding.tried_labels.append(setting.label())
            if evaluation["status"] != "ok":
                continue
            target = finding.target
            if setting == NO_SETTING and (
                    evaluation.get("input_hash") != target.input_hash and target.input_hash
                    or evaluation.get("param_hash") != target.param_hash and target.param_hash):
                finding.status = "failed"
                finding.detail = ("this node builds other input or parameter bytes than the "
                                  "reference (input_hash/param_hash differ): broken inputs, "
                                  "which no setting explains")
                continue
            same, position, first = _score(evaluation["tensors"], target.tensors)
            if same == len(target.tensors) and position == len(target.tensors):
                finding.status = "already" if setting == NO_SETTING else "reproduced"
                finding.setting = None if setting == NO_SETTING else setting
                finding.seconds = time.monotonic() - started
                finding.closest = None
                continue
            if setting != NO_SETTING and (same, position) > finding._closest_score:
                finding._closest_score = (same, position)
                finding.closest = {"label": setting.label(), "setting": setting.to_json(),
                                   "matching": same, "tensors": len(target.tensors),
                                   "first_differing": first}

    def open_targets(variant: str) -> list[Target]:
        return [t for t in by_variant[variant] if findings[t.key].status == "not_reproduced"]

    def wanted(variant: str) -> dict[str, list[list[str]]]:
        return {t.workload: [list(p) for p in t.tensors] for t in open_targets(variant)}

    eager = any(t.kind == TARGET_EAGER for t in targets)
    # The node as it is configured: which results already agree, and its environment.
    local_env: dict[str, Any] = {}
    if eager:
        local_env = _check_eager(run, findings, max(left(), MIN_CHILD_TIMEOUT_S))
    for variant in by_variant:
        if not open_targets(variant):
            continue
        output = run(NO_SETTING, variant, [t.workload for t in open_targets(variant)],
                     [NO_SETTING], wanted(variant), max(left(), MIN_CHILD_TIMEOUT_S))
        if "error" in output:
            for target in open_targets(variant):
                findings[target.key].status = "failed"
                findings[target.key].detail = f"the run as configured failed: {output['error']}"
            continue
        local_env = _merged(local_env, output.get("environment") or {})
        settle(output, variant, [NO_SETTING])
    reference_env = reference.get("environment") or {}
    if eager:
        pool = eager_candidates(local_env, device_type, limit=max_candidates)
    else:
        pool = candidates(reference_env, local_env, device_type, limit=max_candidates,
                          compiler=any(_variants.get(v).compiles for v in by_variant
                                       if v in _variants.VARIANTS))
    log_line(f"explain: {len(pool)} candidate setting(s) for "
             f"{sum(1 for f in findings.values() if f.status == 'not_reproduced')} "
             "result(s) that differ")
    # Consecutive candidates with the same variables share a child, in pool order.
    groups: list[tuple[Setting, list[Setting]]] = []
    for setting in pool:
        env_part = Setting(env=setting.env)
        if groups and groups[-1][0] == env_part:
            groups[-1][1].append(setting)
        else:
            groups.append((env_part, [setting]))
    for env_part, sets in groups:
        for variant in by_variant:
            targets_left = open_targets(variant)
            if not targets_left:
                continue
            if left() <= 0:
                log_line(f"explain: stopped after {max_seconds:g} s")
                break
            # Inductor's settings change only what the compiled variant compiles.
            tried = [s for s in sets if _variants.get(variant).compiles or
                     not s.compiler_only]
            if not tried:
                continue
            output = run(env_part, variant, [t.workload for t in targets_left],
                         [Setting(knobs=s.knobs) for s in tried], wanted(variant),
                         max(left(), MIN_CHILD_TIMEOUT_S))
            if "error" in output:
                log_line(f"explain: {env_part.label()} under {variant}: {output['error']}")
                for target in targets_left:
                    findings[target.key].tried += len(tried)
                continue
            settle(output, variant, tried)
        if not any(f.status == "not_reproduced" for f in findings.values()) or left() <= 0:
            break
    for finding in findings.values():
        if finding.status == "not_reproduced":
            finding.seconds = time.monotonic() - started
    return Explained(list(findings.values()), local_env.get("env_key"))


def _merged(local_env: dict[str, Any], environment: dict[str, Any]) -> dict[str, Any]:
    """The first child's environment, with the Inductor settings a compiling child read
    (as they are here: a candidate never sets one to its current value)."""
    if not local_env:
        return environment
    inductor = {name: value for name, value in (environment.get("knobs") or {}).items()
                if name.startswith(INDUCTOR_PREFIX)}
    return {**local_env, "knobs": {**(local_env.get("knobs") or {}), **inductor}}


def _check_eager(run: Runner, findings: dict[tuple[str, str], Finding],
                 timeout: float) -> dict[str, Any]:
    """The eager target's first step: this node's eager (default) answer as configured
    must still be the run's, else no compiled answer can be called eager's; a finding
    whose eager answer moved fails, saying so. Returns the child's environment."""
    workloads = list(dict.fromkeys(f.target.workload for f in findings.values()))
    output = run(NO_SETTING, EAGER_VARIANT, workloads, [NO_SETTING], {}, timeout)
    if "error" in output:
        for finding in findings.values():
            finding.status = "failed"
            finding.detail = f"the eager ({EAGER_VARIANT}) run failed: {output['error']}"
        return {}
    computed = {e["workload"]: e for e in output.get("evaluations") or []}
    for finding in findings.values():
        evaluation = computed.get(finding.target.workload)
        wanted = finding.target.tensors
        if evaluation is None or evaluation["status"] != "ok":
            why = (evaluation or {}).get("reason") or "not computed"
            finding.status = "failed"
            finding.detail = f"the eager ({EAGER_VARIANT}) run gave no answer: {why}"
            continue
        same, position, first = _score(evaluation["tensors"], wanted)
        if same != len(wanted) or position != len(wanted):
            finding.status = "failed"
            finding.detail = (
                f"this node's eager ({EAGER_VARIANT}) answer is no longer the run's ({same} "
                f"of {len(wanted)} tensors the same, first differing {first}): the run is "
                "another node's or this node's environment changed since; explain against "
                "a new run of this node")
    environment: dict[str, Any] = output.get("environment") or {}
    return environment


def explanation_document(explained: Explained, *, node: str, against: str,
                         device: str, started_at: str, finished_at: str,
                         target: str = TARGET_RUN) -> dict[str, Any]:
    """What `POST /api/v1/explanations` takes (design §2.11). `env_key` says in which
    environment the findings hold: an explain started from another shell than the
    node's runs may not be the node's newest environment. `target`: "eager" when each
    finding is about restoring the run's own eager answer (design §2.14)."""
    document = {"schema": SCHEMA, "node": node, "against": against, "device": device,
                "started_at": started_at, "finished_at": finished_at,
                "findings": [finding.to_json() for finding in explained.findings]}
    if target != TARGET_RUN:
        document["target"] = target
    if explained.env_key:
        document["env_key"] = explained.env_key
    return document


# ---- the server ------------------------------------------------------------------------


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def fetch_reference(client: httpx.Client, server: str, token: str | None, run_id: str
                    ) -> tuple[ServerAnswer, dict[str, Any] | None]:
    """(the answer, the reference) of `GET /api/v1/agent/reference/{run_id}`: each ok
    result's tensor hashes and the run's numeric environment, nothing else."""
    url = server.rstrip("/") + REFERENCE_PATH.format(run_id=run_id)
    try:
        response = client.get(url, headers=_auth(token))
    except httpx.HTTPError as exc:
        return no_answer(url, exc), None
    answer = answer_of(response)
    if not answer.ok:
        return answer, None
    try:
        reference = response.json()
    except ValueError:
        return ServerAnswer(response.status_code, "the reference is not JSON"), None
    return answer, reference if isinstance(reference, dict) else None


def on_device(targets: Sequence[Target], device: str) -> list[Target]:
    """Per (workload, variant) the reference's result on `device` when it has one, else
    its first."""
    chosen: dict[tuple[str, str], Target] = {}
    for target in targets:
        if target.key not in chosen or target.device == device:
            chosen[target.key] = target
    return list(chosen.values())


def post_findings(client: httpx.Client, server: str, token: str | None,
                  document: dict[str, Any]) -> ServerAnswer:
    url = server.rstrip("/") + EXPLANATIONS_PATH
    try:
        response = client.post(url, json=document, headers=_auth(token))
    except httpx.HTTPError as exc:
        return no_answer(url, exc)
    return answer_of(response)
