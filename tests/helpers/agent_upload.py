"""What the upload tests share: agent-fingerprinted documents and a request recorder."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import httpx
import torch

from numparity_agent._environment import compute_env_key
from numparity_agent.testing import fingerprint, main

# A small environment document under its own key (the server derives it, design §3.1).
ENVIRONMENT = {"torch": {"version": "2.13.0"}}
ENVIRONMENT = {"env_key": compute_env_key(ENVIRONMENT), **ENVIRONMENT}


def agent_document(node: str) -> dict[str, Any]:
    """A run document whose tensors are fingerprinted by the agent itself."""
    generator = torch.Generator().manual_seed(7)
    specs = [("conv1", "layer", (8, 16, 12, 12)), ("fc1", "layer", (8, 128)),
             ("output", "output", (8, 10))]
    tensors = [{"name": name, "kind": kind, "order": order,
                **fingerprint(torch.randn(shape, generator=generator))}
               for order, (name, kind, shape) in enumerate(specs)]
    results = [{"suite": "standard", "workload": "cnn", "workload_version": 1,
                "variant": variant, "device": "cpu", "status": "ok",
                "input_hash": "i" * 64, "param_hash": "p" * 64, "repeats": 2,
                "repeats_agree": True, "wall_s": 0.1, "tensors": copy.deepcopy(tensors)}
               for variant in ("default", "strict")]
    return {
        "schema": "numparity.run/v1", "run_id": str(uuid.uuid4()),
        "node": {"name": node, "labels": {}}, "agent_version": "0.1.0",
        "started_at": "2026-11-21T10:00:00Z", "finished_at": "2026-11-21T10:00:41Z",
        "drill": False, "environment": copy.deepcopy(ENVIRONMENT),
        "results": results,
    }


_CLIENT_INIT = httpx.Client.__init__


class Recorder:
    """Counts what the agent sends, per path, through an httpx event hook."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, bytes]] = []

    def __call__(self, request: httpx.Request) -> None:
        self.requests.append((request.url.path, request.content))

    def sent(self, path: str) -> list[bytes]:
        return [body for p, body in self.requests if p == path]


def flush_with(monkeypatch, recorder: Recorder, *args: str) -> int:
    """`numparity-agent flush ARGS` with every httpx.Client of the agent recording."""
    def init(self, *a, **kw):
        kw["event_hooks"] = {"request": [recorder]}
        _CLIENT_INIT(self, *a, **kw)

    monkeypatch.setattr(httpx.Client, "__init__", init)
    return main(["flush", *args])
