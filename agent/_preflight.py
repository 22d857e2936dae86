"""What `run` checks before the suite: mistakes of configuration found in seconds, not
after minutes of compute (and never as an outage that keeps runs in the spool for ever).

- The server: one small request (`POST /api/v1/fingerprints/missing`, empty, with the
  token) must be answered as numparity's API answers an agent. A server that does not
  answer, or is busy (5xx, 408, 429), is no mistake: the run goes on and waits in the
  spool as always. An answer numparity's API cannot have given (a 404: the address has a
  path, another site) is one; so is a refused token (unknown, revoked, or without the
  agent role), which `run` reports as `flush` and `check` do (exit 5, not 2).
- User workloads (`module:factory`): imported in a child, as the suite's children will.

Each returns the problem, or None. This module does not import torch.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from numparity_agent import _workloads
from numparity_agent._answer import (
    ServerAnswer,
    Verify,
    answer_of,
    error_code,
    no_answer,
    not_numparity,
    server_message,
)
from numparity_agent._upload import MISSING_PATH

# A factory's module imports torch and the lab's code: seconds, not minutes.
IMPORT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ServerProblem:
    detail: str  # in words, for the operator
    token_refused: bool  # 401/403: the token, not the address


def server_problem(server: str, token: str | None, *, verify: Verify,
                   timeout: float) -> ServerProblem | None:
    """Why the server's address or the token cannot work, or None (they do, or the server
    is down or busy: that is for the spool)."""
    url = server.rstrip("/") + MISSING_PATH
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(verify=verify, timeout=timeout) as client:
            response = client.post(url, json={"hashes": [], "manifests": []},
                                   headers=headers)
    except httpx.HTTPError as exc:
        answer = no_answer(url, exc)
        if answer.retry or answer.cause == "tls":
            return None
        return ServerProblem(answer.detail, token_refused=False)
    answered = answer_of(response)
    if (answered.status in (404, 405) and error_code(answered.detail) is not None
            and urlsplit(server).path.strip("/") == ""):
        # numparity's own error at the server's root: a server that predates the
        # question (uploads then send the whole document), not a wrong address.
        return None
    return _problem(not_numparity(answered, url, expect="missing"), server)


def _problem(answer: ServerAnswer, server: str) -> ServerProblem | None:
    if answer.ok or answer.retry:
        return None
    if answer.misconfigured:
        return ServerProblem(
            f"{answer.detail}: --server (NUMPARITY_SERVER, config server) must be the "
            f"numparity server's address, as its dashboard's, without /api/v1 ("
            f"{server.rstrip('/').removesuffix('/api/v1').removesuffix('/api')} ?)",
            token_refused=False)
    if answer.status in (401, 403):
        return ServerProblem(
            f"{server} refuses the agent token (HTTP {answer.status}, "
            f"{server_message(answer.detail)}): give the agent a token of role agent "
            "(numparity-server token create --role agent) in --token-file, "
            "NUMPARITY_TOKEN_FILE or token_file", token_refused=True)
    return None  # another answer to an empty question: the upload will say more


def workload_problems(workloads: Sequence[str], *, timeout: float = IMPORT_TIMEOUT_S
                      ) -> list[str]:
    """Each `module:factory` of `workloads` that a child cannot import, with why."""
    specs = [w for w in workloads if _workloads.is_factory_spec(w)]
    problems = []
    for spec in specs:
        code = ("import sys\nfrom numparity_agent._workloads._base import import_factory\n"
                "import_factory(sys.argv[1])\n")
        try:
            done = subprocess.run([sys.executable, "-c", code, spec], capture_output=True,
                                  text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            problems.append(f"workload {spec}: importing it took more than {timeout:g} s")
            continue
        if done.returncode != 0:
            lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
            problems.append(f"workload {spec} cannot be imported: "
                            f"{lines[-1] if lines else f'exit {done.returncode}'}")
    return problems
