"""The `compiled` variant's machinery (design §2.3, §2.14): torch.compile (Inductor) of
a workload's model, its caches, the compile pass and its timing, and where a compiled
result parts from eager (`localise`: leaf modules compiled one at a time).

PyTorch does not promise eager's bits from Inductor ("bitwise equivalence is not the
current expectation of inductor", pytorch/pytorch#179575): it fuses ops, reorders
reductions and keeps intermediates in other precisions. The agent measures what that
does on each node; the server judges it against the node's eager answer and float64.

The parent process only reads `cache_environ` and the names: nothing here imports torch
at module level.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# Inductor's caches (compiled graphs, generated C++/Triton code, autotuning) live in the
# agent's state folder, so a node pays a cold compile once per torch version and keeps
# it between runs. A cache folder the node already sets (CI's TORCHINDUCTOR_CACHE_DIR)
# is kept: the agent never moves a lab's cache.
CACHE_DIR_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
# torch < 2.4 keeps the FX graph cache off unless asked; later versions have it on.
CACHE_SWITCHES = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
# Inductor settings that change numerics (design §2.11): read into each compiled
# result's knobs and tried by `explain`. (name in torch._inductor.config, values tried)
INDUCTOR_PREFIX = "inductor."
INDUCTOR_SETTINGS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("emulate_precision_casts", (True, False)),
    ("fallback_random", (True, False)),
    ("max_autotune", (True, False)),
    ("batch_invariant", (True, False)),
    ("deterministic", (True, False)),
)
# Localisation's bounds: leaf modules compiled alone, and its seconds.
MAX_LEAVES = 12
LOCALISE_BUDGET_S = 600.0
_KERNEL = re.compile(r"^(\w+) = async_compile\.\w+\(", re.MULTILINE)
_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """`$XDG_STATE_HOME/numparity/inductor`, else `~/.local/state/numparity/inductor`
    (beside the default spool); None where there is no home folder either."""
    environ = os.environ if environ is None else environ
    state = environ.get("XDG_STATE_HOME")
    if not state:
        try:
            state = str(Path.home() / ".local" / "state")
        except (KeyError, RuntimeError):
            return None
    return Path(state) / "numparity" / "inductor"


def cache_environ(environ: Mapping[str, str], cache_dir: Path | None) -> dict[str, str]:
    """A compiling child's environment: Inductor's cache folder (the node's own
    TORCHINDUCTOR_CACHE_DIR when set, else `cache_dir`) and its caches switched on. Set
    before torch starts: Inductor reads them when it loads."""
    env = dict(environ)
    if cache_dir is not None and not env.get(CACHE_DIR_VARIABLE):
        env[CACHE_DIR_VARIABLE] = str(cache_dir)
    for name, value in CACHE_SWITCHES.items():
        env.setdefault(name, value)
    return env


# ---- in the child ---------------------------------------------------------------------


def compile_reason(torch: Any) -> str | None:
    """Why this torch cannot compile at all (None: it can)."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile (it needs torch >= 2.0)"
    major_minor = tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2])
    if major_minor < (2, 1):
        return f"the compiled variant needs torch >= 2.1; this is {torch.__version__}"
    return None


def compile_in_place(model: Any) -> None:
    """torch.compile (Inductor, default mode) of `model`'s forward, in place: its module
    names stay its own (`torch.compile(model)` would prefix them `_orig_mod.`), so its
    layers are recorded under eager's names. The forward, not the module's call
    (`nn.Module.compile`): dynamo then traces the leaf modules' recording hooks into one
    graph, where compiling the call broke the graph at every hooked leaf (9 graphs for
    mlp's 5 leaves on torch 2.13) and so compiled each leaf apart."""
    import torch

    model.forward = torch.compile(model.forward, backend="inductor")


def reset() -> None:
    """Forget every compiled frame: the next call compiles again, from Inductor's caches
    where they hold it (a warm compile)."""
    import torch

    torch._dynamo.reset()


def cache_counters() -> dict[str, int]:
    """The compiled graphs served by a cache (Inductor's FX graph cache, or
    AOTAutograd's, which holds Inductor's code too and is asked first where it is on),
    those Inductor had to generate (FX graph cache misses), and dynamo's graphs so far."""
    from torch._dynamo.utils import counters

    inductor: Mapping[str, int] = counters.get("inductor", {})
    autograd: Mapping[str, int] = counters.get("aot_autograd", {})
    stats: Mapping[str, int] = counters.get("stats", {})
    return {"cache_hits": int(inductor.get("fxgraph_cache_hit", 0))
            + int(autograd.get("autograd_cache_hit", 0)),
            "cache_misses": int(inductor.get("fxgraph_cache_miss", 0)),
            "graphs": int(stats.get("unique_graphs", 0))}


def counted(before: Mapping[str, int]) -> dict[str, int]:
    """What `cache_counters` counted since `before`."""
    return {key: value - before.get(key, 0) for key, value in cache_counters().items()}


def inductor_knobs() -> dict[str, Any]:
    """The Inductor settings of INDUCTOR_SETTINGS this torch has, as they are."""
    try:
        from torch._inductor import config
    except ImportError:
        return {}
    return {INDUCTOR_PREFIX + name: getattr(config, name) for name, _values in INDUCTOR_SETTINGS
            if hasattr(config, name)}


def is_compiler_error(exc: BaseException) -> bool:
    """Whether `exc` comes from torch's compiler (dynamo, AOTAutograd, Inductor, the C++
    or Triton toolchain) rather than from the workload: a compile that fails is
    `skipped` with torch's reason (design §2.3), anything else `failed`."""
    for error in _chain(exc):
        if type(error).__module__.startswith(("torch._dynamo", "torch._inductor",
                                              "torch._functorch", "torch._subclasses")):
            return True
        tb = error.__traceback__
        while tb is not None:
            path = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
            if "/torch/_dynamo/" in path or "/torch/_inductor/" in path:
                return True
            tb = tb.tb_next
    return False


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def skip_reason(exc: BaseException, workload: str) -> str:
    """torch's reason, first line first: `torch.compile cannot compile mlp: …`."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    rest = "\n".join(lines[1:12])
    return (f"torch.compile cannot compile {workload}: {type(exc).__name__}: {first}"
            + (f"\n{rest}" if rest else ""))[:4000]


def kernels_since(count: int) -> list[str]:
    """The kernels of the output code Inductor loaded after its `count`-th module
    (`PyCodeCache.modules`): generated ones (`cpp_fused__softmax_0`,
    `triton_per_fused__softmax_0`) and the library calls (`extern_kernels.mm`)."""
    modules = _code_modules()
    found: list[str] = []
    for module in modules[count:]:
        path = getattr(module, "__file__", None)
        if not path:
            continue
        try:
            source = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for name in [*_KERNEL.findall(source),
                     *(f"extern_kernels.{n}" for n in _EXTERN.findall(source))]:
            if name not in found:
                found.append(name)
    return found[:32]


def code_modules_count() -> int:
    return len(_code_modules())


def _code_modules() -> list[Any]:
    try:
        from torch._inductor.codecache import PyCodeCache
    except ImportError:
        return []
    modules = getattr(PyCodeCache, "modules", None)
    if isinstance(modules, list):
        return modules
    cache = getattr(PyCodeCache, "cache", None)  # older torch: key -> module
    return list(cache.values()) if isinstance(cache, dict) else []


def localise(workload: Any, *, dtype: Any, device: Any, first_differing: str | None,
             budget_s: float = LOCALISE_BUDGET_S,
             max_leaves: int = MAX_LEAVES) -> dict[str, Any]:
    """Where inside the compiled graph a compiled result parts from eager: each leaf
    module, in execution order up to the first recorded layer that differs (the
    nearest `max_leaves` of them), compiled alone on its own eager input, against its
    eager output. `module`: the first whose compiled output differs (with the kernels
    Inductor generated for it); None when every one gives eager's bits alone — the
    difference then comes from fusion across modules, which only the whole graph
    makes. Never raises: an error becomes `error`."""
    import torch

    from numparity_agent._fingerprint import same_bits
    from numparity_agent._workloads._base import Recorder, layer_tensors

    started = time.perf_counter()
    found: dict[str, Any] = {"module": None, "leaves_tried": 0, "kernels": []}
    try:
        built = workload.build(dtype=dtype, device=device)
        modules = dict(built.model.named_modules())
        leaves = {name for name, m in modules.items()
                  if name and not any(True for _ in m.children())}
        captured: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        order: list[str] = []
        handles = []
        for name in leaves:
            def pre_hook(_m: Any, args: Any, kwargs: Any, name: str = name) -> None:
                if name not in captured:
                    order.append(name)
                    captured[name] = (_detached(args), _detached(kwargs))

            handles.append(modules[name].register_forward_pre_hook(pre_hook,
                                                                   with_kwargs=True))
        try:
            workload.run(built, Recorder())
        finally:
            for handle in handles:
                handle.remove()
        candidates = order
        if first_differing is not None:
            at = next((i for i, name in enumerate(order) if first_differing == name
                       or first_differing.startswith((f"{name}.", f"{name}#"))), None)
            if at is not None:
                candidates = order[:at + 1]
        candidates = candidates[-max_leaves:]
        found["candidates"] = len(candidates)
        for name in candidates:
            if time.perf_counter() - started > budget_s:
                found["note"] = (f"stopped after {found['leaves_tried']} leaf module(s): "
                                 f"the {budget_s:g} s budget is spent")
                break
            module, (args, kwargs) = modules[name], captured[name]
            with torch.no_grad():
                expected = layer_tensors(module(*args, **kwargs))
                reset()
                loaded = code_modules_count()
                got = layer_tensors(torch.compile(module, backend="inductor")(*args,
                                                                             **kwargs))
            found["leaves_tried"] += 1
            if len(got) != len(expected) or not all(
                    same_bits(a, b) for a, b in zip(got, expected, strict=True)):
                found["module"] = name
                found["kernels"] = kernels_since(loaded)
                break
        else:
            found["note"] = (
                "every leaf module up to the first differing layer gives eager's bits "
                "compiled alone: the difference comes from what Inductor fuses across "
                "modules in the whole graph")
    except Exception as exc:  # noqa: BLE001 - the result stands without its localisation
        found["error"] = f"{type(exc).__name__}: {str(exc).strip()[:1000]}"
    finally:
        reset()
    found["seconds"] = round(time.perf_counter() - started, 3)
    return found


def _detached(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value
