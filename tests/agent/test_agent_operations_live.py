"""The agent against real numparity servers, as a fleet runs it: under `env -i`, with a
revoked token, a refused document, a run sent twice, over TLS with a lab's own CA, and
with the token kept out of everything it prints or leaves behind."""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers.agent import clean_env
from helpers.agent_operations import (
    AGENT,
    Answer,
    agent,
    closed_port_url,
    files_text,
    fill_the_disk,
    names,
    scripted_server,
    valid_document,
)
from helpers.processes import free_port, run_cli, stop_process

from numparity_agent import _cli  # patched: the jitter's sleep
from numparity_agent.testing import main, spool_document, spooled

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def token_file(folder: Path, token: str, name: str = "agent.token") -> Path:
    path = folder / name
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def create_agent_token(database_url: str, label: str) -> tuple[str, int]:
    done = run_cli("token", "create", "--role", "agent", "--label", label,
                   database_url=database_url)
    (token_id,) = re.findall(r"created token (\d+)", done.stderr)
    return done.stdout.strip(), int(token_id)


def stored_run(server, run_id: str) -> httpx.Response:
    return httpx.get(f"{server.base_url}/api/v1/runs/{run_id}", headers=server.headers("reader"),
                     timeout=10)


def test_a_cron_run_with_no_environment_at_all(live_server, tmp_path):
    """`env -i PATH=/usr/bin:/bin numparity-agent run ...`: no HOME, USER, LANG."""
    spool = tmp_path / "spool"
    done = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", AGENT, "run", "--workloads", "probes",
         "--variants", "default", "--repeats", "1", "--server", live_server.base_url,
         "--token-file", str(token_file(tmp_path, live_server.agent_token)),
         "--spool", str(spool)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    (run_id,) = re.findall(r"uploaded \d{8}T\d{6}Z-([0-9a-f-]{36})\.json \(HTTP 201\)",
                           done.stderr)
    assert spooled(spool) == []
    summary = stored_run(live_server, run_id).json()
    assert [(r["workload"], r["variant"], r["status"]) for r in summary["results"]] == [
        ("probes", "default", "ok")]
    assert live_server.agent_token not in done.stdout + done.stderr


def test_a_token_bound_to_another_node_sets_the_run_aside_and_says_why(live_server, tmp_path):
    """A 403 of a node-bound token refuses the run (its node), not the token (issue 40
    finding 4: kept in the spool, it blocked every later run): the run is set aside in
    rejected/ with the server's reason naming the node, and goes once a token may write
    it (`spool resend`)."""
    spool = tmp_path / "spool"
    flags = ["--server", live_server.base_url, "--spool", str(spool)]
    done = run_cli("token", "create", "--role", "agent", "--node", "gpu-01",
                   database_url=live_server.database_url)
    wrong, (wrong_id,) = done.stdout.strip(), re.findall(r"created token (\d+)", done.stderr)
    spooled_run = spool_document(valid_document("gpu-02"), spool)
    done = agent("flush", *flags, "--token-file", str(token_file(tmp_path, wrong)))
    assert done.returncode == 5, done.stderr
    assert (f"server rejected {spooled_run.name} (HTTP 403, node_forbidden: token "
            f"{wrong_id} is bound to gpu-01: it may not write runs of node 'gpu-02')"
            in done.stderr)
    assert wrong not in done.stderr
    assert spooled(spool) == [] and (spool / "rejected" / spooled_run.name).exists()
    assert stored_run(live_server, spooled_run.stem[17:]).status_code == 404

    done = run_cli("token", "create", "--role", "agent", "--node-pattern", "gpu-*",
                   database_url=live_server.database_url)
    done = agent("spool", "resend", spooled_run.name, *flags, "--token-file",
                 str(token_file(tmp_path, done.stdout.strip(), "gpus.token")))
    assert done.returncode == 0, done.stderr
    assert spooled(spool) == [] and not any((spool / "rejected").iterdir())
    assert stored_run(live_server, spooled_run.stem[17:]).status_code == 200


def test_a_revoked_token_keeps_runs_until_it_is_fixed(live_server, tmp_path):
    spool = tmp_path / "spool"
    doomed, doomed_id = create_agent_token(live_server.database_url, "doomed")
    flags = ["--server", live_server.base_url, "--spool", str(spool)]
    first = spool_document(valid_document("node-r", "2026-11-21T10:00:00Z"), spool)
    done = agent("flush", *flags, "--token-file", str(token_file(tmp_path, doomed)))
    assert done.returncode == 0, done.stderr

    run_cli("token", "revoke", str(doomed_id), database_url=live_server.database_url)
    second = spool_document(valid_document("node-r", "2026-11-21T11:00:00Z"), spool)
    done = agent("flush", *flags, "--token-file", str(tmp_path / "agent.token"))
    assert done.returncode == 5, done.stderr
    assert f"refused the agent token for {second.name} (HTTP 401, unauthorized:" in done.stderr
    assert "check the token" in done.stderr and doomed not in done.stderr
    assert spooled(spool) == [second] and not (spool / "rejected").exists()

    # The operator installs a new token: the kept run goes.
    done = agent("flush", *flags, "--token-file",
                 str(token_file(tmp_path, live_server.agent_token, "new.token")))
    assert done.returncode == 0, done.stderr
    assert spooled(spool) == []
    assert stored_run(live_server, first.stem[17:]).status_code == 200
    assert stored_run(live_server, second.stem[17:]).status_code == 200


def test_a_document_the_server_refuses_is_set_aside_and_the_others_go(live_server, tmp_path):
    spool = tmp_path / "spool"
    broken = valid_document("node-x", "2026-11-21T10:00:00Z")
    broken["results"][0]["status"] = "exploded"
    refused = spool_document(broken, spool)
    fine = spool_document(valid_document("node-x", "2026-11-21T11:00:00Z"), spool)
    done = agent("flush", "--server", live_server.base_url, "--spool", str(spool),
                 "--token-file", str(token_file(tmp_path, live_server.agent_token)))
    assert done.returncode == 5, done.stderr
    assert spooled(spool) == []
    assert names(spool / "rejected") == [refused.name, refused.name + ".reason"]
    reason = (spool / "rejected" / (refused.name + ".reason")).read_text()
    assert f"rejected by {live_server.base_url} (HTTP 422): validation_error:" in reason
    assert '"loc":["body","results",0,"status"]' in reason
    assert f"uploaded {fine.name} (HTTP 201)" in done.stderr
    assert stored_run(live_server, broken["run_id"]).status_code == 404


def test_a_run_sent_twice_is_one_run(live_server, tmp_path):
    """The server stored it but the agent died before deleting it: sent again, answered
    200, deleted; the server still has one run."""
    spool = tmp_path / "spool"
    document = valid_document("node-twice")
    body = spool_document(document, spool).read_bytes()
    flags = ["--server", live_server.base_url, "--spool", str(spool), "--token-file",
             str(token_file(tmp_path, live_server.agent_token))]
    assert agent("flush", *flags).returncode == 0
    (spool / f"20261121T100041Z-{document['run_id']}.json").write_bytes(body)
    done = agent("flush", *flags)
    assert done.returncode == 0 and "(HTTP 200)" in done.stderr, done.stderr
    assert spooled(spool) == []
    runs = httpx.get(f"{live_server.base_url}/api/v1/nodes/node-twice",
                     headers=live_server.headers("reader"), timeout=10).json()
    assert [run["run_id"] for run in runs["runs"]["items"]] == [document["run_id"]]


# --- TLS -------------------------------------------------------------------------------

@dataclass
class TlsServer:
    base_url: str
    ca: Path
    agent_token: str


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(folder: Path) -> Path:
    """A lab CA and a certificate for 127.0.0.1 (an IP SAN) signed by it; the CA's path."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=numparity test lab CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=folder)
    (folder / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
             cwd=folder)
    return folder / "ca.pem"


SERVE_TLS = """
import sys, uvicorn
uvicorn.run("numparity_server.app:create_app_from_environment", factory=True, host="127.0.0.1",
            port=int(sys.argv[1]), ssl_keyfile=sys.argv[2], ssl_certfile=sys.argv[3],
            log_level="warning")
"""


@pytest.fixture
def tls_server(tmp_path) -> Iterator[TlsServer]:
    """The real server app under uvicorn with TLS, on SQLite (TLS has nothing to do with
    the database)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed: cannot make test certificates")
    folder = tmp_path / "tls"
    folder.mkdir()
    ca = make_certificates(folder)
    database_url = f"sqlite:///{tmp_path / 'tls.db'}"
    run_cli("migrate", database_url=database_url)
    token, _id = create_agent_token(database_url, "tls")
    port = free_port()
    log = (tmp_path / "tls-server.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE_TLS, str(port), str(folder / "server.key"),
         str(folder / "server.pem")],
        env={**clean_env(), "NUMPARITY_DATABASE_URL": database_url}, stdout=log,
        stderr=subprocess.STDOUT)
    base_url = f"https://127.0.0.1:{port}"
    try:
        context = ssl.create_default_context(cafile=str(ca))
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / "tls-server.log").read_text()
            try:
                if httpx.get(f"{base_url}/readyz", verify=context, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "tls-server.log").read_text()
            time.sleep(0.1)
        yield TlsServer(base_url=base_url, ca=ca, agent_token=token)
    finally:
        stop_process(process)
        log.close()


def test_tls_with_a_lab_ca_needs_ca_bundle(tls_server, tmp_path):
    spool = tmp_path / "spool"
    first = spool_document(valid_document("node-tls", "2026-11-21T10:00:00Z"), spool)
    flags = ["--server", tls_server.base_url, "--spool", str(spool), "--token-file",
             str(token_file(tmp_path, tls_server.agent_token))]
    started = time.monotonic()
    done = agent("flush", *flags)
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - started < 30  # no backoff: waiting fixes no certificate
    assert "TLS certificate could not be verified" in done.stderr
    assert "pass --ca-bundle FILE" in done.stderr
    assert spooled(spool) == [first]

    done = agent("flush", *flags, "--ca-bundle", str(tls_server.ca))
    assert done.returncode == 0, done.stderr
    assert f"uploaded {first.name} (HTTP 201)" in done.stderr

    second = spool_document(valid_document("node-tls", "2026-11-21T11:00:00Z"), spool)
    done = agent("flush", *flags, env=clean_env(NUMPARITY_CA_BUNDLE=str(tls_server.ca)))
    assert done.returncode == 0, done.stderr
    assert f"uploaded {second.name} (HTTP 201)" in done.stderr
    assert spooled(spool) == []


def test_a_ca_bundle_that_is_not_one_is_a_usage_error(tmp_path):
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    done = agent("flush", "--server", "https://127.0.0.1:9", "--spool", str(tmp_path / "s"),
                 "--ca-bundle", str(bogus))
    assert done.returncode == 2
    assert f"cannot use --ca-bundle {bogus} as a CA bundle" in done.stderr


# --- the token, never printed -----------------------------------------------------------

HOLDER = """
import sys, time
from pathlib import Path
from numparity_agent.testing import spool_lock
with spool_lock(Path(sys.argv[1]), "run"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_the_token_appears_nowhere_on_any_failure_path(live_server, tls_server, tmp_path,
                                                      monkeypatch, capsys):
    token, token_id = create_agent_token(live_server.database_url, "hygiene")
    run_cli("token", "revoke", str(token_id), database_url=live_server.database_url)
    secret = token_file(tmp_path, token)
    seen: list[str] = []
    spools: list[Path] = []

    def flush(name: str, server: str, *extra: str, expect: int) -> None:
        spool = tmp_path / name
        spools.append(spool)
        spool_document(valid_document(f"node-{name}"), spool)
        # Half of the paths get the token on the command line, the worst place for it.
        how = ["--token", token] if len(spools) % 2 else ["--token-file", str(secret)]
        done = agent("flush", "--server", server, "--spool", str(spool), "--max-wait", "1",
                     *how, *extra)
        assert done.returncode == expect, (name, done.stderr)
        seen.extend([done.stdout, done.stderr])

    flush("unreachable", closed_port_url(), expect=3)
    flush("revoked", live_server.base_url, expect=5)
    flush("tls", tls_server.base_url, expect=3)
    # A server (or a proxy before it) that echoes the request's token in its answers.
    echo = {"error": "validation_error", "detail": f"bad request from Bearer {token}"}
    with scripted_server(Answer(422, echo)) as server:
        flush("rejected", server.url, expect=5)
    with scripted_server(Answer(503, echo)) as server:
        flush("busy", server.url, expect=3)
    lock_spool = tmp_path / "locked"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock_spool)], env=clean_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        flush("locked", closed_port_url(), expect=7)
    finally:
        holder.kill()
        holder.wait()

    # A full disk (the spool write fails) and the direct upload refused with the echo.
    fill_the_disk(monkeypatch)
    monkeypatch.setattr(_cli, "sleep", lambda seconds: None)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    with scripted_server(Answer(401, echo)) as server:
        code = main(["run", "--workloads", "agent_test_workloads:crash_in_strict",
                     "--variants", "default", "--repeats", "1", "--server", server.url,
                     "--token", token, "--spool", str(tmp_path / "full")])
    assert code == 6
    captured = capsys.readouterr()
    seen.extend([captured.out, captured.err])
    assert "bad request from Bearer ***" in captured.err  # the echo, masked

    (reason,) = (tmp_path / "rejected" / "rejected").glob("*.reason")
    assert "bad request from Bearer ***" in reason.read_text()
    everything = "\n".join(seen + [files_text(spool) for spool in spools])
    assert token not in everything
