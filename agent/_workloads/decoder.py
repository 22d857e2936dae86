"""`decoder`: a small GPT-style decoder and the three answers an LLM lab asks of it
(design §2.2).

The model: token embeddings tied to the output head, 2 pre-norm blocks of RMSNorm,
causal self-attention with rotary position embeddings (through
F.scaled_dot_product_attention, a leaf `blocks.N.attn.sdpa`), RMSNorm and a SwiGLU MLP;
a final RMSNorm. Weights and tokens come from the portable generator (design §2.1). The
sizes named here are the standard suite's (`SIZE`); the large suite builds the same model
at its own (`large.LargeDecoder`).

Recorded: every leaf module of a prefill of 24 tokens, and its logits (`output`);
then three self-consistency checks, each as tensors (kind `probe`, so `/divergence`
groups and judges them like any other) and as a verdict in the result's `checks` field
(`_checks.agreement`: bitwise equal, max ULP, max relative error):

- `decode_equals_prefill`: the same tokens decoded one at a time with a KV cache
  (`decode.logits`, every position) against the prefill's logits;
- `batch_invariant`: each request (7, 12, 19, 24 tokens) prefilled alone
  (`batch.alone`, its last position's logits) against inside one right-padded batch
  (`batch.batched`); `op` names the first module (execution order) whose output for the
  request differs — on a CPU whose GEMM blocks by the number of rows, the first linear;
  every position's logits of both are recorded too (`batch.request<i>`, `batch.padded`:
  version 2), so a wrong value at an earlier position differs from the peers' answer;
- `attention_backends_agree`: layer 0's attention inputs through each SDPA backend the
  device has (`sdpa.math`, and `sdpa.flash`, `sdpa.efficient`, `sdpa.cudnn` where they
  run), each against math; `default` names the backend the default path chose
  (`torch._fused_sdp_choice`), `op` the first backend that disagrees.

With right padding and a causal mask a request's real tokens never attend to padding, so
the batched answer is mathematically the request's own: any difference is the kernels'.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from numparity_agent._workloads._base import (
    Built,
    Recorder,
    Workload,
    bell_tensor,
    class_labels,
    init_default_,
    layer_hooks,
    place,
)
from numparity_agent._workloads._checks import agreement, worst
from numparity_agent._workloads._sizes import DecoderSize

# The standard suite's decoder. SwiGLU's hidden is about 8/3 of d_model, a multiple of 16.
SIZE = DecoderSize(vocab=256, d_model=64, heads=4, layers=2, hidden=176, seq=24,
                   request_lengths=(7, 12, 19, 24))
ROPE_BASE = 10000.0
RMS_EPS = 1e-6
# SDPABackend member -> the name the checks use.
BACKENDS = {"MATH": "math", "FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient",
            "CUDNN_ATTENTION": "cudnn"}


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 (at least) as LLaMA does."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return normed.to(x.dtype) * self.weight


class Rotary(nn.Module):
    """Rotary position embeddings on (batch, heads, seq, head_dim) q and k, from cos/sin
    tables of the positions they hold."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class CausalAttention(nn.Module):
    """F.scaled_dot_product_attention: causal over a prefill, every cached key for one
    decoded token."""

    def __init__(self) -> None:
        super().__init__()
        self.keep_inputs = False
        self.inputs: tuple[torch.Tensor, ...] | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.keep_inputs and self.inputs is None:
            self.inputs = (q.detach().clone(), k.detach().clone(), v.detach().clone())
        return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[-2] > 1)


class Attention(nn.Module):
    def __init__(self, size: DecoderSize) -> None:
        super().__init__()
        self.heads, self.head_dim = size.heads, size.head_dim
        self.qkv = nn.Linear(size.d_model, 3 * size.d_model, bias=False)
        self.rope = Rotary()
        self.sdpa = CausalAttention()
        self.proj = nn.Linear(size.d_model, size.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: list[torch.Tensor] | None) -> torch.Tensor:
        batch, seq, d_model = x.shape
        qkv = self.qkv(x).reshape(batch, seq, 3, self.heads, self.head_dim).permute(
            2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.rope(q, k, cos, sin)
        if cache is not None:
            if cache:  # the keys and values of the tokens before
                k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
            cache[:] = [k, v]
        attended = self.sdpa(q, k, v).transpose(1, 2).reshape(batch, seq, d_model)
        return self.proj(attended)


class SwiGLU(nn.Module):
    def __init__(self, size: DecoderSize) -> None:
        super().__init__()
        self.gate = nn.Linear(size.d_model, size.hidden, bias=False)
        self.up = nn.Linear(size.d_model, size.hidden, bias=False)
        self.act = nn.SiLU()
        self.down = nn.Linear(size.hidden, size.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, size: DecoderSize) -> None:
        super().__init__()
        self.norm1 = RMSNorm(size.d_model)
        self.attn = Attention(size)
        self.norm2 = RMSNorm(size.d_model)
        self.mlp = SwiGLU(size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: list[torch.Tensor] | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, cache)
        return x + self.mlp(self.norm2(x))


class TiedHead(nn.Module):
    """The output projection with the token embeddings' weights (tied)."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self._embedding = [embedding]  # a list: not a submodule, no second parameter

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self._embedding[0].weight)


class GPT(nn.Module):
    def __init__(self, size: DecoderSize) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(size.vocab, size.d_model)
        self.blocks = nn.ModuleList(Block(size) for _ in range(size.layers))
        self.norm_f = RMSNorm(size.d_model)
        self.lm_head = TiedHead(self.tok_emb)
        cos, sin = _rope_tables(size)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    cos: torch.Tensor
    sin: torch.Tensor

    def forward(self, tokens: torch.Tensor, start: int = 0,
                caches: list[list[torch.Tensor]] | None = None) -> torch.Tensor:
        """Logits of `tokens` (batch, seq) at positions start.., extending `caches` (one
        per block) when given."""
        seq = tokens.shape[1]
        cos, sin = self.cos[start:start + seq], self.sin[start:start + seq]
        x = self.tok_emb(tokens)
        for index, block in enumerate(self.blocks):
            x = block(x, cos, sin, caches[index] if caches is not None else None)
        return self.lm_head(self.norm_f(x))


def _rope_tables(size: DecoderSize) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * inv_freq, (seq, head_dim), computed in float64 with
    numpy and rounded once to float32. A libm whose float64 cos is 1 ULP off changes the
    float32 only for a value within 2**-29 of a rounding boundary: the pinned param_hash
    (tests) would show it."""
    head_dim = size.head_dim
    inv_freq = ROPE_BASE ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(size.seq, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return (torch.from_numpy(np.cos(angles).astype(np.float32)),
            torch.from_numpy(np.sin(angles).astype(np.float32)))


class Decoder(Workload):
    name = "decoder"
    version = 2  # 2: every position's logits of the batch check recorded
    size = SIZE

    def __init__(self, size: DecoderSize | None = None) -> None:
        if size is not None:
            self.size = size

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        size = self.size
        model = GPT(size)
        init_default_(model, self)
        with torch.no_grad():
            model.tok_emb.weight.copy_(bell_tensor(self, "tok_emb.weight",
                                                   (size.vocab, size.d_model), std=0.5))
        model.eval()
        inputs = {"tokens": class_labels(self, "input.tokens", size.seq, size.vocab
                                         ).reshape(1, size.seq)}
        for index, length in enumerate(size.request_lengths):
            inputs[f"request{index}"] = class_labels(
                self, f"input.request{index}", length, size.vocab).reshape(1, length)
        built = place(Built(model=model, inputs=inputs), dtype=dtype, device=device)
        # The rotary tables stay float32 (cast at use), as the positions' exact angles.
        built.model.cos = built.model.cos.float()  # type: ignore[assignment]
        built.model.sin = built.model.sin.float()  # type: ignore[assignment]
        return built

    def run(self, built: Built, recorder: Recorder) -> None:
        model: Any = built.model
        tokens = built.inputs["tokens"]
        with torch.no_grad():
            model.blocks[0].attn.sdpa.keep_inputs = True
            with layer_hooks(model, recorder):
                logits = model(tokens)
            recorder.record("output", "output", logits)
            model.blocks[0].attn.sdpa.keep_inputs = False
            checks = {
                "decode_equals_prefill": _decode(model, tokens, logits, recorder),
                "batch_invariant": _batched(model, built, recorder),
                "attention_backends_agree": attention_backends(
                    model.blocks[0].attn.sdpa.inputs, recorder),
            }
        recorder.fields["checks"] = checks


def _decode(model: Any, tokens: torch.Tensor, prefill: torch.Tensor,
            recorder: Recorder) -> dict[str, Any]:
    seq = tokens.shape[1]
    caches: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    steps = [model(tokens[:, t:t + 1], start=t, caches=caches) for t in range(seq)]
    decoded = torch.cat(steps, dim=1)
    recorder.record("decode.logits", "probe", decoded)
    found = agreement(decoded, prefill)
    if not found["equal"]:
        differs = (decoded != prefill).reshape(seq, -1).any(-1).nonzero()
        found["first_position"] = int(differs[0]) if len(differs) else None
    return found


@contextlib.contextmanager
def _captured(model: nn.Module) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Every leaf module's output tensors, in execution order, while the block runs."""
    seen: list[tuple[str, torch.Tensor]] = []
    handles = []
    for name, module in model.named_modules():
        if name and not any(True for _ in module.children()):
            def hook(_m: nn.Module, _a: Any, out: Any, name: str = name) -> None:
                items = out if isinstance(out, tuple) else (out,)
                for i, item in enumerate(items):
                    if isinstance(item, torch.Tensor):
                        seen.append((name if len(items) == 1 else f"{name}.{i}",
                                     item.detach().clone()))
            handles.append(module.register_forward_hook(hook))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _row(batched: torch.Tensor, row: int, like: torch.Tensor) -> torch.Tensor:
    """Row `row` of a batched activation, cut to the alone run's sequence length (the
    one dimension besides the batch whose size differs)."""
    cut = batched[row:row + 1]
    for dim, (size, wanted) in enumerate(zip(cut.shape, like.shape, strict=True)):
        if size != wanted:
            cut = cut.narrow(dim, 0, wanted)
    return cut


def _batched(model: Any, built: Built, recorder: Recorder) -> dict[str, Any]:
    requests = [tensor for name, tensor in built.inputs.items() if name.startswith("request")]
    lengths = [request.shape[1] for request in requests]
    longest = max(lengths)
    padded = torch.zeros(len(requests), longest, dtype=requests[0].dtype,
                         device=requests[0].device)
    for i, request in enumerate(requests):
        padded[i, :request.shape[1]] = request[0]
    alone_runs, alone_logits = [], []
    for request in requests:
        with _captured(model) as seen:
            logits = model(request)
        alone_runs.append((logits[0, -1], seen))
        alone_logits.append(logits)
    with _captured(model) as batched_seen:
        batched_logits = model(padded)
    alone = torch.stack([last for last, _ in alone_runs])
    batched = torch.stack([batched_logits[i, length - 1]
                           for i, length in enumerate(lengths)])
    recorder.record("batch.alone", "probe", alone)
    recorder.record("batch.batched", "probe", batched)
    # Every position's logits of both ways, not the last ones alone: a wrong value at an
    # earlier position differs from the peers' answer too.
    for i, every in enumerate(alone_logits):
        recorder.record(f"batch.request{i}", "probe", every)
    recorder.record("batch.padded", "probe", batched_logits)
    found = agreement(batched, alone)
    found["requests"] = lengths
    found["op"] = None
    if not found["equal"]:
        # The first module, in execution order, whose output for a request differs.
        for i, (_last, seen) in enumerate(alone_runs):
            for (name, mine), (_n, theirs) in zip(seen, batched_seen, strict=True):
                if not torch.equal(_row(theirs, i, mine), mine):
                    order = [n for n, _ in seen]
                    if found["op"] is None or order.index(name) < order.index(found["op"]):
                        found["op"] = name
                    break
    return found


def attention_backends(inputs: tuple[torch.Tensor, ...] | None,
                       recorder: Recorder) -> dict[str, Any]:
    """Layer 0's attention through each SDPA backend that runs here, each against math."""
    assert inputs is not None
    q, k, v = inputs
    outputs: dict[str, torch.Tensor] = {}
    skipped: dict[str, str] = {}
    for member, name in BACKENDS.items():
        try:
            with _only_backend(member):
                outputs[name] = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        except (RuntimeError, NotImplementedError, AttributeError) as exc:
            skipped[name] = str(exc).strip().splitlines()[0][:300] if str(exc) else (
                type(exc).__name__)
    for name, value in outputs.items():
        recorder.record(f"sdpa.{name}", "probe", value)
    math = outputs.get("math")
    per_backend = {name: agreement(value, math) for name, value in outputs.items()
                   if name != "math" and math is not None}
    found = worst(list(per_backend.values())) if per_backend else {
        "equal": True, "max_ulp": 0, "max_rel": 0.0}
    found.update(backends=per_backend, skipped=skipped, default=_default_backend(q, k, v),
                 op=next((name for name, c in per_backend.items() if not c["equal"]), None))
    return found


@contextlib.contextmanager
def _only_backend(member: str) -> Iterator[None]:
    """scaled_dot_product_attention restricted to one backend: torch >= 2.3's
    sdpa_kernel; before it, the CUDA flags of torch.backends.cuda.sdp_kernel (CPU flash
    honours them too)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        flags = {"enable_math": member == "MATH", "enable_flash": member == "FLASH_ATTENTION",
                 "enable_mem_efficient": member == "EFFICIENT_ATTENTION"}
        if member == "CUDNN_ATTENTION":
            raise NotImplementedError("this torch has no cuDNN attention") from None
        with torch.backends.cuda.sdp_kernel(**flags):
            yield
        return
    with sdpa_kernel([getattr(SDPBackend, member)]):
        yield


def _default_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """The backend scaled_dot_product_attention's default path picks for these inputs."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return None
    try:
        choice = int(choose(q, k, v, None, 0.0, True))
        from torch.nn.attention import SDPBackend

        member = next(m for m in BACKENDS if int(getattr(SDPBackend, m)) == choice)
    except Exception:  # noqa: BLE001 - an older torch: not known, never guessed
        return None
    return BACKENDS[member]
