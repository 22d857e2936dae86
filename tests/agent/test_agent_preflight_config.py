"""`run` finds a mistake of configuration before the suite runs (nothing run, nothing
spooled), and tells it from a server that is down (kept, exit 3): a server address
without its scheme, one with the API's path, a user workload that cannot be imported
(exit 2), a token the server refuses, here one without the agent role (exit 5, as `flush`
and `check` say of a refused token). Through a live server and the real agent in a child
process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.agent import clean_env, run_agent

# What a run would show once its suite started.
STARTED = "variant default:"


def _run(tmp_path: Path, server: str, token: str, *args: str) -> Any:
    return run_agent("run", "--server", server, "--spool", str(tmp_path / "spool"),
                     "--device", "cpu", "--workloads", "mlp", "--variants", "default",
                     "--repeats", "1", "--max-wait", "0", *args,
                     env=clean_env(NUMPARITY_TOKEN=token), timeout=300)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_misconfigured_node_stops_before_the_suite(live_server: Any,
                                                     tmp_path: Path) -> None:
    host = live_server.base_url.removeprefix("http://")
    cases = {
        "no scheme": (host, live_server.agent_token, (),
                      f"did you mean 'http://{host}'?", 2),
        "the API's path": (f"{live_server.base_url}/api/v1", live_server.agent_token, (),
                           f"without /api/v1 ({live_server.base_url} ?)", 2),
        "a reader token": (live_server.base_url, live_server.reader_token, (),
                           "needs the agent role; the token has the reader role", 5),
        "a workload that is not there": (
            live_server.base_url, live_server.agent_token,
            ("--workloads", "lab_models_typo:make"),
            "workload lab_models_typo:make cannot be imported: ModuleNotFoundError", 2),
    }
    for case, (server, token, extra, says, code) in cases.items():
        done = _run(tmp_path, server, token, *extra)
        assert done.returncode == code, (case, done.stderr)
        assert says in done.stderr, (case, done.stderr)
        assert STARTED not in done.stderr, case
        spool = tmp_path / "spool"
        assert not spool.exists() or not list(spool.glob("*.json")), case


def test_a_server_that_is_down_is_no_mistake(tmp_path: Path) -> None:
    """The control: nothing answers at the address, so the run goes on and waits in the
    spool (3), as it always did."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    done = _run(tmp_path, closed, "np_unused")
    assert done.returncode == 3, done.stderr
    assert STARTED in done.stderr
    assert len(list((tmp_path / "spool").glob("*.json"))) == 1
