"""The agent as a cron job on thousands of nodes (design §2.6, §4): backoff, the server's
refusals, quarantine, a full disk, the lock, jitter, the config file and what an
operator reads on stderr. The server here is a scripted loopback HTTP server (it answers
503, 429 or 401 on demand) and sleeps are recorded instead of slept; real numparity
servers are in test_agent_operations_live.py."""

from __future__ import annotations

import configparser
import errno
import json
import os
import pty
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.agent import clean_env
from helpers.agent_operations import (
    AGENT,
    TIMESTAMPED,
    Answer,
    FakeSleep,
    agent,
    closed_port_url,
    fill_the_disk,
    names,
    scripted_server,
    small_document,
)

from numparity_agent import _cli, _config  # patched: the jitter's sleep, the default config
from numparity_agent.testing import ConfigError, main, resolve_config, spool_document, spooled

REPO = Path(__file__).resolve().parents[2]
TOKEN = "ops-token-3f9c1d"
TINY_RUN = ["--workloads", "agent_test_workloads:crash_in_strict", "--variants", "default",
            "--repeats", "1"]


@pytest.fixture
def fake_sleep(monkeypatch) -> FakeSleep:
    sleep = FakeSleep()
    monkeypatch.setattr(_cli, "sleep", sleep)
    return sleep


@pytest.fixture(autouse=True)
def no_numparity_environment(monkeypatch):
    """Tests set NUMPARITY_* themselves; a developer's own settings must not leak in."""
    for key in list(os.environ):
        if key.startswith("NUMPARITY_"):
            monkeypatch.delenv(key)
    monkeypatch.setattr(_config, "DEFAULT_CONFIG", Path("/nonexistent/numparity/agent.toml"))


def flush(url: str, spool: Path, *extra: str) -> int:
    return main(["flush", "--server", url, "--token", TOKEN, "--spool", str(spool), *extra])


def spool_three(spool: Path) -> list[Path]:
    """Three documents, oldest first."""
    return [spool_document(small_document(f"2026-11-2{day}T10:00:00Z", run_id=f"run-{day}"),
                           spool) for day in (1, 2, 3)]


# --- backoff ---------------------------------------------------------------------------

def test_a_busy_server_is_retried_with_growing_delays_then_uploaded(tmp_path, fake_sleep,
                                                                    capsys):
    spool = tmp_path / "spool"
    (path,) = [spool_document(small_document("2026-11-21T10:00:00Z", run_id="run-a"), spool)]
    with scripted_server(Answer(503), Answer(502), Answer(201)) as server:
        assert flush(server.url, spool) == 0
    assert server.run_ids() == ["run-a"] * 3  # the same run_id each time: one run
    assert spooled(spool) == []
    first, second = fake_sleep.delays
    assert 0.5 <= first <= 1.0 and 1.0 <= second <= 2.0  # 1 s, 2 s, each with jitter
    err = capsys.readouterr().err
    assert f"{path.name}: HTTP 503" in err and "retrying in" in err
    assert "exit 0: ok" in err


def test_retry_after_is_honoured(tmp_path, fake_sleep):
    spool = tmp_path / "spool"
    spool_document(small_document("2026-11-21T10:00:00Z"), spool)
    throttled = Answer(429, {"error": "too_many_requests", "detail": "slow down"},
                       {"Retry-After": "7"})
    with scripted_server(throttled, Answer(201)) as server:
        assert flush(server.url, spool) == 0
    assert fake_sleep.delays == [pytest.approx(7.0)]


def test_a_server_that_stays_down_is_not_hammered_with_every_file(tmp_path, fake_sleep,
                                                                  capsys):
    spool = tmp_path / "spool"
    paths = spool_three(spool)
    with scripted_server(Answer(503)) as server:
        assert flush(server.url, spool, "--max-wait", "10") == 3
    # Only the oldest was tried, a bounded number of times; all three wait for the next run.
    assert set(server.run_ids()) == {"run-1"}
    assert len(server.run_ids()) == len(fake_sleep.delays) + 1 >= 3
    assert sum(fake_sleep.delays) <= 10
    assert spooled(spool) == paths
    err = capsys.readouterr().err
    assert "giving up after" in err and "2 more document(s) stay in the spool" in err
    assert "exit 3: kept in the spool for the next run" in err


def test_a_retry_after_beyond_max_wait_gives_up_at_once(tmp_path, fake_sleep):
    spool = tmp_path / "spool"
    spool_document(small_document("2026-11-21T10:00:00Z"), spool)
    with scripted_server(Answer(503, headers={"Retry-After": "600"})) as server:
        assert flush(server.url, spool) == 3
    assert len(server.run_ids()) == 1 and fake_sleep.delays == []


def test_an_unreachable_server_is_retried_within_max_wait(tmp_path, fake_sleep, capsys):
    spool = tmp_path / "spool"
    spool_three(spool)
    assert flush(closed_port_url(), spool) == 3  # the default --max-wait: 60 s
    assert 4 <= len(fake_sleep.delays) and sum(fake_sleep.delays) <= 60
    for attempt, delay in enumerate(fake_sleep.delays):  # 1, 2, 4 ... s, jittered by half
        step = min(30, 2 ** attempt)
        assert step / 2 <= delay <= step
    assert len(spooled(spool)) == 3
    assert "unreachable: ConnectError" in capsys.readouterr().err


def test_max_wait_zero_tries_once(tmp_path, fake_sleep):
    spool = tmp_path / "spool"
    spool_three(spool)
    with scripted_server(Answer(500)) as server:
        assert flush(server.url, spool, "--max-wait", "0") == 3
    assert server.run_ids() == ["run-1"] and fake_sleep.delays == []


# --- the server refuses ----------------------------------------------------------------

@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_token_keeps_every_document_and_says_so(tmp_path, fake_sleep, capsys, status):
    spool = tmp_path / "spool"
    paths = spool_three(spool)
    refusal = Answer(status, {"error": "unauthorized", "detail": "invalid or revoked token"})
    with scripted_server(refusal) as server:
        assert flush(server.url, spool) == 5
    assert server.run_ids() == ["run-1"]  # the others would be refused the same way
    assert spooled(spool) == paths and not (spool / "rejected").exists()
    err = capsys.readouterr().err
    assert f"refused the agent token for {paths[0].name}" in err
    assert f"HTTP {status}, unauthorized: invalid or revoked token" in err
    assert "it stays in the spool" in err and "exit 5: refused by the server" in err
    assert TOKEN not in err


@pytest.mark.parametrize("status", [400, 409, 422])
def test_a_refused_document_moves_to_rejected_with_its_reason(tmp_path, fake_sleep, capsys,
                                                              status):
    spool = tmp_path / "spool"
    old, new, newest = spool_three(spool)
    refusal = Answer(status, {"error": "validation_error",
                              "detail": [{"loc": ["body", "results"], "msg": "bad"}]})
    with scripted_server(refusal, Answer(201)) as server:
        assert flush(server.url, spool) == 5
    assert server.run_ids() == ["run-1", "run-2", "run-3"]
    assert spooled(spool) == []
    rejected = spool / "rejected"
    assert names(rejected) == [old.name, old.name + ".reason"]
    reason = (rejected / (old.name + ".reason")).read_text()
    assert f"(HTTP {status})" in reason and "validation_error" in reason
    assert server.url in reason
    err = capsys.readouterr().err
    assert f"server rejected {old.name} (HTTP {status}" in err
    assert f"uploaded {new.name}" in err and f"uploaded {newest.name}" in err
    # Never retried: the next flush finds nothing.
    assert flush(server.url, spool) == 0


def test_a_document_too_large_even_in_parts_stays_in_the_spool(tmp_path, fake_sleep, capsys):
    """A 413 is not the document's fault (issue 28): never rejected for its size."""
    spool = tmp_path / "spool"
    old, new, newest = spool_three(spool)
    too_large = Answer(413, {"error": "upload_too_large",
                             "detail": "the document passes 1024 bytes once decoded"})
    with scripted_server(too_large, Answer(201)) as server:
        assert flush(server.url, spool) == 3
    assert spooled(spool) == [old] and not (spool / "rejected").exists()
    err = capsys.readouterr().err
    assert f"{old.name} even in parts" in err and "it stays in the spool" in err
    assert f"uploaded {new.name}" in err and f"uploaded {newest.name}" in err


# --- quarantine ------------------------------------------------------------------------

def test_corrupt_spool_files_are_quarantined_and_never_block_the_others(tmp_path, fake_sleep,
                                                                        capsys):
    spool = tmp_path / "spool"
    good = spool_document(small_document("2026-11-22T10:00:00Z", run_id="run-good"), spool)
    whole = good.read_text()
    bad = {
        "20261120T100000Z-truncated.json": whole[: len(whole) // 2],
        "20261120T110000Z-garbage.json": "\x00\x01 not json",
        "20261120T120000Z-list.json": "[1, 2, 3]",
        "20261120T130000Z-other.json": json.dumps({"hello": "world"}),
        "20261120T140000Z-empty.json": "",
    }
    for name, text in bad.items():
        (spool / name).write_text(text)
    stale = spool / ".20261120T090000Z-crashed.json.tmp"
    stale.write_text(whole[:100])
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    fresh = spool / ".20261122T100001Z-being-written.json.tmp"
    fresh.write_text(whole[:100])

    with scripted_server(Answer(201)) as server:
        assert flush(server.url, spool) == 8
    assert server.run_ids() == ["run-good"]
    quarantine = spool / "quarantine"
    expected = sorted([*bad, "20261120T090000Z-crashed.json.tmp"])
    assert names(quarantine) == sorted([*expected, *(f"{n}.reason" for n in expected)])
    reasons = {n: (quarantine / f"{n}.reason").read_text() for n in expected}
    assert "not JSON, truncated or corrupt" in reasons["20261120T100000Z-truncated.json"]
    assert "not JSON" in reasons["20261120T110000Z-garbage.json"]
    assert "not a run document" in reasons["20261120T120000Z-list.json"]
    assert "not a run document" in reasons["20261120T130000Z-other.json"]
    assert "empty file" in reasons["20261120T140000Z-empty.json"]
    assert "did not finish" in reasons["20261120T090000Z-crashed.json.tmp"]
    assert fresh.exists()  # another process may still be writing it
    err = capsys.readouterr().err
    for name in bad:
        assert f"warning: {name} is " in err and "moved to" in err
    assert "exit 8: a spool file was quarantined" in err
    # Never retried: the next flush has nothing to do.
    assert flush(server.url, spool) == 0


# --- a full disk -----------------------------------------------------------------------

@pytest.fixture
def full_disk(monkeypatch):
    fill_the_disk(monkeypatch)


def test_spooling_on_a_full_disk_raises_a_clear_error_and_leaves_no_partial_file(
        tmp_path, full_disk):
    spool = tmp_path / "spool"
    with pytest.raises(OSError) as raised:
        spool_document(small_document("2026-11-21T10:00:00Z"), spool)
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value) == (f"[Errno {errno.ENOSPC}] cannot write to the spool {spool}: "
                                 "No space left on device (ENOSPC)")
    assert names(spool, ".*") + names(spool) == []


@pytest.mark.parametrize("server_up", [True, False], ids=["server-up", "server-down"])
def test_a_run_on_a_full_disk_is_uploaded_directly_and_exits_6(tmp_path, full_disk, fake_sleep,
                                                                capsys, monkeypatch, server_up):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    spool = tmp_path / "spool"
    with scripted_server(Answer(201)) as server:
        url = server.url if server_up else closed_port_url()
        code = main(["run", *TINY_RUN, "--server", url, "--token", TOKEN, "--spool",
                     str(spool), "--max-wait", "0"])
    assert code == 6
    err = capsys.readouterr().err
    assert f"error: cannot write to the spool {spool}: No space left on device (ENOSPC)" in err
    assert names(spool, "*.json") == [] and names(spool, ".*.tmp") == []
    if server_up:
        (run,) = server.runs()
        assert f"uploaded run {run['run_id']} directly (HTTP 201)" in err
    else:
        assert "is lost: the spool could not take it and the server did not" in err
    assert "exit 6: the spool could not be written" in err


def _mount_tmpfs(where: Path, size: str) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)
    return done.returncode == 0


def test_a_run_on_a_really_full_filesystem(tmp_path):
    """A real tmpfs, filled up: the same as the monkeypatched write above."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "256k"):
        pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)")
    try:
        spool = disk / "spool"
        spool.mkdir()
        with open(disk / "filler", "wb", buffering=0) as filler:  # take every free block
            with pytest.raises(OSError) as full:
                while True:
                    filler.write(b"\0" * 4096)
            assert full.value.errno == errno.ENOSPC
        with scripted_server(Answer(201)) as server:
            done = agent("run", *TINY_RUN, "--server", server.url, "--token", TOKEN,
                         "--spool", str(spool))
        assert done.returncode == 6, done.stderr
        assert (f"cannot write to the spool {spool}: No space left on device (ENOSPC)"
                in done.stderr)
        (run,) = server.runs()
        assert f"uploaded run {run['run_id']} directly" in done.stderr
        assert names(spool, "*.json") == [] and names(spool, ".*.tmp") == []
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# --- the lock --------------------------------------------------------------------------

HOLDER = """
import sys, time
from pathlib import Path
from numparity_agent.testing import spool_lock
with spool_lock(Path(sys.argv[1]), "run"):
    print("held", flush=True)
    time.sleep(120)
"""


def _hold_lock(spool: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(spool)], env=clean_env(),
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_a_second_agent_exits_7_naming_the_holder(tmp_path):
    spool = tmp_path / "spool"
    holder = _hold_lock(spool)
    try:
        for command in (["flush"], ["run", *TINY_RUN]):
            done = agent(*command, "--server", closed_port_url(), "--spool", str(spool),
                         timeout=60)
            assert done.returncode == 7, done.stderr
            assert f"another numparity-agent holds {spool / '.lock'} (pid {holder.pid}, " \
                   "numparity-agent run since " in done.stderr
            assert "variant" not in done.stderr  # the run did not start
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_of_a_killed_agent_is_taken_over(tmp_path):
    spool = tmp_path / "spool"
    holder = _hold_lock(spool)
    holder.kill()  # SIGKILL: no clean release, the lock file still names it
    holder.wait()
    assert f"pid {holder.pid}," in (spool / ".lock").read_text()
    done = agent("flush", "--server", closed_port_url(), "--spool", str(spool))
    assert done.returncode == 0, done.stderr
    assert (f"took over the spool's lock from a numparity-agent that is gone (pid {holder.pid}, "
            in done.stderr)
    assert (spool / ".lock").read_text() == ""  # released cleanly this time


# --- what an operator reads ------------------------------------------------------------

def test_cron_gets_one_plain_timestamped_line_per_event(tmp_path):
    """No terminal (cron, systemd): plain lines, jitter logged, nothing redrawn."""
    spool = tmp_path / "spool"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with scripted_server(Answer(201)) as server:
        done = agent("run", "--workloads", "probes", "--variants", "default", "--repeats", "1",
                     "--server", server.url, "--token-file", str(token_file), "--spool",
                     str(spool), "--jitter", "0.3", stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "\r" not in done.stderr and "\x1b" not in done.stderr
    lines = done.stderr.splitlines()
    assert all(re.match(TIMESTAMPED, line) for line in lines), lines
    events = [line.split("numparity-agent: ", 1)[1] for line in lines]
    (run_id,) = server.run_ids()
    expected = [r"jitter: waiting 0\.[0-3] s \(a random 0\.\.0\.3 s\) before the run",
                r"variant default: running probes on cpu",
                r"variant default: probes ok in [0-9.]+ s$",
                r"variant default: done in .* s",
                r"device cpu \(.+\): done in .* s",
                rf"spooled \d{{8}}T\d{{6}}Z-{run_id}\.json in {re.escape(str(spool))}",
                rf"uploaded \d{{8}}T\d{{6}}Z-{run_id}\.json \(HTTP 201\)",
                r"spool .*: 1 uploaded",
                r"exit 0: ok"]
    assert len(events) == len(expected), events
    for event, pattern in zip(events, expected, strict=True):
        assert re.fullmatch(pattern, event), (event, pattern)
    assert spooled(spool) == []


def test_a_terminal_gets_a_progress_line_and_the_same_events(tmp_path):
    out = tmp_path / "doc.json"
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [AGENT, "run", "--workloads", "probes", "mlp", "--variants", "default",
             "--repeats", "1", "--output", str(out)],
            env={**clean_env(), "TERM": "xterm"}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=terminal)
        os.close(terminal)
        screen = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the agent closed its end
                break
            if not chunk:
                break
            screen += chunk
        assert process.wait(timeout=120) == 0
    finally:
        os.close(controller)
    text = screen.decode().replace("\r\n", "\n")
    # The progress line is redrawn in place (carriage return, erase line) ...
    assert re.search(r"\r\x1b\[K\[0/2\] probes/default \d+:\d\d", text), text
    assert re.search(r"\r\x1b\[K\[2/2\] default done \d+:\d\d", text), text
    # ... the events still come as whole lines, and the line is erased at the end.
    assert re.search(TIMESTAMPED + "variant default: probes ok", text)
    assert re.search(TIMESTAMPED + "variant default: mlp ok", text)
    after_progress = text.rsplit("\r\x1b[K", 1)[1]
    assert re.fullmatch(rf"({TIMESTAMPED}.*\n)+", after_progress), after_progress
    assert after_progress.endswith("numparity-agent: exit 0: ok\n")
    assert json.loads(out.read_text())["results"][0]["workload"] == "probes"


def test_a_watched_variant_that_hangs_is_still_killed_at_its_timeout(monkeypatch):
    """The terminal's progress display watches the child; the timeout holds all the same."""
    from numparity_agent.testing import run_variant

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    seen: list[int] = []
    started = time.monotonic()
    _env, (result,) = run_variant("strict", workloads=["agent_test_workloads:hang_in_strict"],
                                  device="cpu", repeats=1, timeout=6, node_env_vars={},
                                  on_progress=seen.append)
    assert time.monotonic() - started < 30
    assert result["status"] == "failed"
    assert result["error"] == "variant strict timed out after 6 s (child killed)"
    assert seen and set(seen) == {0}


def test_help_documents_every_exit_code():
    done = agent("run", "--help")
    assert done.returncode == 0
    for code in range(9):
        assert re.search(rf"^\s+{code}\s+\S", done.stdout, re.MULTILINE), code
    assert "when several apply, the first of 6, 4, 5, 8, 3 wins" in done.stdout
    # The manual's table of what the operator does, code by code.
    page = (REPO / "docs" / "reference" / "exit-codes.md").read_text()
    for code in range(9):
        assert re.search(rf"^\| {code} \|", page, re.MULTILINE), code


# --- the config file -------------------------------------------------------------------

def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_command_line_beats_environment_beats_config_file(tmp_path):
    config = write_config(tmp_path / "agent.toml", """
        server = "https://from-file"
        repeats = 3
        max_wait = 5
        workloads = ["cnn", "probes"]
        spool = "spool-dir"
        [labels]
        rack = "b2"
        row = 4
    """.replace("\n        ", "\n"))
    env = {"NUMPARITY_SERVER": "https://from-env", "NUMPARITY_REPEATS": "4",
           "NUMPARITY_LABELS": "row=5,zone=eu"}
    cli = {"server": "https://from-cli", "labels": ["zone=us"]}
    resolved = resolve_config(cli, env, str(config))
    assert resolved.values["server"] == "https://from-cli"
    assert resolved.values["repeats"] == 4 and resolved.sources["repeats"] == "NUMPARITY_REPEATS"
    assert resolved.values["max_wait"] == 5.0
    assert resolved.values["workloads"] == ["cnn", "probes"]
    assert resolved.values["spool"] == tmp_path / "spool-dir"  # beside the config file
    assert resolved.values["labels"] == {"rack": "b2", "row": "5", "zone": "us"}
    assert resolved.get("device") is None  # not set anywhere: the default applies
    resolved = resolve_config({}, {}, str(config))
    assert resolved.values["server"] == "https://from-file" and resolved.values["repeats"] == 3


def test_a_config_file_runs_a_flush_with_its_token_file(tmp_path, monkeypatch, fake_sleep):
    (tmp_path / "agent.token").write_text(TOKEN + "\n")
    (tmp_path / "agent.token").chmod(0o600)
    with scripted_server(Answer(503), Answer(201)) as server:
        config = write_config(tmp_path / "agent.toml", f"""
            server = "{server.url}"
            token_file = "agent.token"
            spool = "spool"
            max_wait = 30
            upload_timeout = 5
        """.replace("\n            ", "\n"))
        spool_document(small_document("2026-11-21T10:00:00Z"), tmp_path / "spool")
        monkeypatch.setenv("NUMPARITY_CONFIG", str(config))  # as the default path would
        assert main(["flush"]) == 0
    assert [h["Authorization"] for p, h, _b in server.requests] == [f"Bearer {TOKEN}"] * 2
    assert len(fake_sleep.delays) == 1


def test_the_default_config_file_is_read_when_it_exists(tmp_path, monkeypatch, capsys):
    config = write_config(tmp_path / "agent.toml", 'server = "http://127.0.0.1:9"\n'
                                                   f'spool = "{tmp_path / "spool"}"\n')
    monkeypatch.setattr(_config, "DEFAULT_CONFIG", config)
    assert main(["flush"]) == 0  # the server and spool came from it
    assert f"nothing spooled in {tmp_path / 'spool'}" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "message"), [
    ('sever = "https://typo"\n', "unknown key 'sever'"),
    ("repeats = 'many'\n", "repeats in "),
    ("repeats = 0\n", "repeats in "),
    ("jitter = -1\n", "jitter in "),
    ("labels = ['a']\n", "labels in "),
    ("server = \n", "is not valid TOML"),
    ('token = "x1234"\ntoken_file = "/etc/numparity/agent.token"\n', "both token in"),
])
def test_a_bad_config_file_is_a_usage_error_naming_the_key(tmp_path, capsys, text, message):
    config = write_config(tmp_path / "agent.toml", text)
    assert main(["run", "--config", str(config), "--output", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and str(config) in err


def test_a_missing_config_file_or_token_file_is_a_usage_error(tmp_path, capsys):
    assert main(["flush", "--config", str(tmp_path / "none.toml")]) == 2
    assert f"config file {tmp_path / 'none.toml'} does not exist" in capsys.readouterr().err
    assert main(["flush", "--server", "http://x", "--token-file", str(tmp_path / "no")]) == 2
    assert f"cannot read the token file {tmp_path / 'no'}: No such file" in capsys.readouterr().err


def test_a_token_others_can_read_is_warned_about(tmp_path, capsys):
    config = tmp_path / "agent.toml"
    config.write_text(f'token = "{TOKEN}"\nserver = "http://127.0.0.1:9"\n'
                      f'spool = "{tmp_path / "spool"}"\n')
    config.chmod(0o644)
    assert main(["flush", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert f"the config file {config} holds the agent token and others can read it" in err
    assert TOKEN not in err


def test_without_tomllib_or_tomli_the_config_says_what_it_needs(tmp_path, monkeypatch):
    """Python 3.10 without tomli (tomllib is 3.11+; the agent adds no dependency)."""
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", None)
    config = write_config(tmp_path / "agent.toml", 'server = "http://x"\n')
    with pytest.raises(ConfigError, match="needs Python 3.11 or the tomli package"):
        resolve_config({}, {}, str(config))


# --- deployment files ------------------------------------------------------------------

def test_the_systemd_units_parse_and_say_what_they_must(tmp_path):
    units = REPO / "deploy" / "systemd"
    service, timer = units / "numparity-agent.service", units / "numparity-agent.timer"
    parsed = {}
    for unit in (service, timer):
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str  # systemd keys are case-sensitive
        parser.read_string(unit.read_text())
        parsed[unit.suffix] = parser
    assert parsed[".service"]["Service"]["Type"] == "oneshot"
    assert "numparity-agent run" in parsed[".service"]["Service"]["ExecStart"]
    assert parsed[".service"]["Service"]["SuccessExitStatus"] == "3"
    assert parsed[".service"]["Unit"]["After"] == "network-online.target"
    assert parsed[".timer"]["Timer"]["OnCalendar"] == "hourly"
    assert parsed[".timer"]["Timer"]["RandomizedDelaySec"]
    assert parsed[".timer"]["Install"]["WantedBy"] == "timers.target"
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return  # configparser above is the check then
    # verify wants ExecStart to exist: point it at this checkout's agent.
    copies = tmp_path / "units"
    copies.mkdir()
    (copies / service.name).write_text(
        service.read_text().replace("/opt/ml/bin/numparity-agent", AGENT))
    (copies / timer.name).write_text(timer.read_text())
    done = subprocess.run([analyze, "verify", "--man=no", str(copies / service.name),
                           str(copies / timer.name)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
