"""`train`: a few Adam steps of a small MLP with cross entropy (design §2.2).

Recorded: the forward activations of step 0 (layer hooks), the loss of every step
(`loss.stepN`), the gradients of step 1 (`grad.<param path>`, zero-based, i.e. after one
optimizer update, so they already depend on Adam's arithmetic), and the parameters
after the last step (`param.<param path>`).

Under fp16 autocast a GradScaler scales the loss, as users must to keep fp16
gradients from underflowing; a step whose gradients hold inf/NaN is skipped by the
scaler, and the result's "train" field says how many were and the final scale. The
recorded gradients are unscaled (true gradients), so they compare across variants.
Backward and the optimizer step run outside autocast, as PyTorch recommends.

The optimizer is `Adam` below: torch.optim.Adam's default step on the CPU (the
single-tensor path, without weight decay or amsgrad) written out with the same tensor
operations in the same order, so it is bitwise the same there (a test checks it). It
exists because constructing any torch.optim optimizer imports torch._dynamo, ~2.5 s in
every variant's child process: more than the whole workload. A fixed update rule also
keeps the workload's definition from changing when torch reorganises its optimizers
(on CUDA torch.optim.Adam defaults to the foreach path, which this does not mimic).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from numparity_agent._workloads._base import (
    Built,
    Recorder,
    Workload,
    autocast_dtype,
    bell_tensor,
    class_labels,
    init_default_,
    layer_hooks,
    place,
)

BATCH = 64
FEATURES = (64, 128, 10)
STEPS = 3
GRAD_STEP = 1
LR = 1e-3
ADAM_EPS = 1e-8


class Adam:
    """Adam (Kingma & Ba) as torch.optim.Adam's single-tensor step computes it.

    Duck-types what GradScaler needs of an optimizer (`param_groups`, `step`).
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = ADAM_EPS,
    ) -> None:
        self.params = list(params)
        self.param_groups = [{"params": self.params}]
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        self.steps = 0
        self.exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]
        self.exp_avg_sqs = [
            torch.zeros_like(p, memory_format=torch.preserve_format) for p in params
        ]

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        step = float(self.steps)  # torch keeps a float32 step tensor and reads .item()
        bias_correction1 = 1 - self.beta1**step
        bias_correction2 = 1 - self.beta2**step
        step_size = self.lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        for param, exp_avg, exp_avg_sq in zip(
            self.params, self.exp_avgs, self.exp_avg_sqs, strict=True
        ):
            grad = param.grad
            if grad is None:
                continue
            exp_avg.lerp_(grad, 1 - self.beta1)
            exp_avg_sq.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)


def grad_scaler(device_type: str, init_scale: float) -> Any:
    """A GradScaler for `device_type`, or None where this torch has none.

    torch.amp.GradScaler(device) exists from torch 2.3 (with CPU support); before it,
    only torch.cuda.amp.GradScaler.
    """
    scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_class is not None:
        try:
            return scaler_class(device_type, init_scale=init_scale)
        except (TypeError, RuntimeError, AssertionError):
            pass
    if device_type == "cuda":
        return torch.cuda.amp.GradScaler(init_scale=init_scale)
    return None


class Train(Workload):
    name = "train"
    version = 1
    # GradScaler's default; a test subclass raises it to force inf gradients.
    init_scale: float = 2.0**16
    # The sizes (the large suite's `LargeTrain` has its own).
    batch: int = BATCH
    features: tuple[int, int, int] = FEATURES
    steps: int = STEPS

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        d_in, hidden, classes = self.features
        model = nn.Sequential(
            OrderedDict(fc1=nn.Linear(d_in, hidden), act1=nn.GELU(), fc2=nn.Linear(hidden, classes))
        )
        init_default_(model, self)
        model.train()
        x = bell_tensor(self, "input.x", (self.batch, d_in))
        y = class_labels(self, "input.y", self.batch, classes)
        return place(Built(model=model, inputs={"x": x, "y": y}), dtype=dtype, device=device)

    def run(self, built: Built, recorder: Recorder) -> None:
        model, x, y = built.model, built.inputs["x"], built.inputs["y"]
        device_type = x.device.type
        fp16 = autocast_dtype(device_type) == torch.float16
        scaler = grad_scaler(device_type, self.init_scale) if fp16 else None
        optimizer = Adam(list(model.parameters()), lr=LR, eps=ADAM_EPS)
        skipped = 0
        for step in range(self.steps):
            optimizer.zero_grad()
            hooks = layer_hooks(model, recorder) if step == 0 else contextlib.nullcontext()
            with hooks:
                loss = F.cross_entropy(model(x), y)
            recorder.record(f"loss.step{step}", "loss", loss)
            with torch.autocast(device_type, enabled=False):
                if scaler is None:
                    loss.backward()
                else:
                    scaler.scale(loss).backward()
                    scaler.unscale_(optimizer)
                if step == GRAD_STEP:
                    for name, param in model.named_parameters():
                        if param.grad is not None:
                            recorder.record(f"grad.{name}", "grad", param.grad)
                with recorder.phase("optimizer"):
                    if scaler is None:
                        optimizer.step()
                    else:
                        scale = scaler.get_scale()
                        scaler.step(optimizer)
                        scaler.update()
                        # The scale only grows after 2000 clean steps: a drop is a skip.
                        skipped += int(scaler.get_scale() < scale)
        for name, param in model.named_parameters():
            recorder.record(f"param.{name}", "param", param)
        recorder.fields["train"] = {
            "steps": self.steps,
            "grad_scaler": scaler is not None,
            "skipped_steps": skipped,
            "scale": float(scaler.get_scale()) if scaler is not None else None,
        }
        if fp16 and scaler is None:
            recorder.fields["train"]["grad_scaler_reason"] = (
                f"torch {torch.__version__} has no GradScaler for {device_type}"
            )
