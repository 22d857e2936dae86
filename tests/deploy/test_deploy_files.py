"""The lab deployment files, checked without a Docker engine.

docker-compose.yml is parsed with PyYAML and its topology checked (PostgreSQL with a
named volume, migrations once, two replicas of the server image, one proxy that alone
publishes a port); deploy/nginx.conf is read for the upstream, the body limit and the
retry rules, and run through ``nginx -t`` when nginx is installed; the Dockerfile and
.dockerignore are read line by line; every ``numparity-server`` command they (and the
systemd unit) run is checked against the real CLI. ``docker compose config`` validates
the compose file when the compose plugin is installed. The same topology runs without
Docker in tests/e2e/test_two_servers.py.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.nginx import (
    NGINX_CONF,
    NO_NGINX,
    check_config,
    find_nginx,
    render_for_loopback,
    upstream_servers,
)
from helpers.processes import free_port, server_command, start_server, stop_process, wait_ready

from numparity_server.cli import _parser
from numparity_server.kit.settings import Settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
ENV_EXAMPLE = REPO / ".env.example"
SYSTEMD_UNIT = REPO / "deploy" / "systemd" / "numparity-server.service"
REPLICAS = ("server-1", "server-2")
# Stands in for the secrets a real .env holds, where the compose file requires them.
TEST_ENV = {"POSTGRES_PASSWORD": "test-only-password"}


# -- docker-compose.yml -------------------------------------------------------------------


@cache
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?message}`` with ``env``."""
    env = TEST_ENV if env is None else env

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op == ":-":
            return arg or ""
        if op == ":?":
            raise AssertionError(f"{name} is required: {arg}")
        return ""

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:[-?])([^}]*))?\}", one, value)


def command_of(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
    return [interpolate(word) for word in words]


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {key: str(value) for key, value in environment.items()}


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """{service: condition}; the short list form means service_started."""
    depends = service.get("depends_on") or {}
    if isinstance(depends, list):
        return dict.fromkeys(depends, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in depends.items()}


def healthcheck_test(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else test


def test_compose_has_the_lab_topology() -> None:
    assert {"db", "migrate", *REPLICAS, "proxy"} <= set(services())
    serving = {name for name, service in services().items()
               if "command" in service and command_of(service)[:2] == ["numparity-server",
                                                                          "serve"]}
    assert serving == set(REPLICAS), "the replicas are the services that run `serve`"


def test_db_is_postgresql_with_a_named_volume_and_a_healthcheck() -> None:
    db = services()["db"]
    assert db["image"].startswith("postgres:16")
    named = compose().get("volumes") or {}
    data = [v for v in db["volumes"]
            if (v if isinstance(v, str) else v["target"]).endswith("/var/lib/postgresql/data")]
    assert len(data) == 1, db["volumes"]
    source = data[0].split(":")[0] if isinstance(data[0], str) else data[0]["source"]
    assert source in named, f"{source!r} is not a named volume (top-level `volumes:`)"
    assert "pg_isready" in healthcheck_test(db)
    assert "ports" not in db


def test_no_literal_password_anywhere() -> None:
    """Passwords come from the environment (.env), never from the file itself."""
    password = environment_of(services()["db"])["POSTGRES_PASSWORD"]
    assert re.fullmatch(r"\$\{POSTGRES_PASSWORD(:\?[^}]*)?\}", password), password
    for name, service in services().items():
        for key, value in environment_of(service).items():
            for userinfo in re.findall(r"://([^@/\s]+)@", value):
                assert ":" not in userinfo or ":${" in userinfo, (name, key, value)
    example = dict(line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
                   if line and not line.startswith("#"))
    assert "POSTGRES_PASSWORD" in example, "the variables the compose file needs"
    referenced = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", COMPOSE.read_text()))
    assert referenced <= set(example), referenced - set(example)


def test_migrate_runs_once_after_the_database_is_healthy() -> None:
    migrate = services()["migrate"]
    assert command_of(migrate) == ["numparity-server", "migrate"]
    assert depends_on(migrate) == {"db": "service_healthy"}
    assert migrate["restart"] == "no"
    assert "ports" not in migrate


@pytest.mark.parametrize("replica", REPLICAS)
def test_replica_waits_for_migrate_and_runs_its_image(replica: str) -> None:
    server, migrate = services()[replica], services()["migrate"]
    assert depends_on(server)["migrate"] == "service_completed_successfully"
    assert depends_on(server)["db"] == "service_healthy"
    assert server["image"] == migrate["image"], "the replicas run the image migrate runs"
    assert server.get("build") == migrate.get("build")
    assert "/readyz" in healthcheck_test(server)
    url = environment_of(server)["NUMPARITY_DATABASE_URL"]
    assert url == environment_of(migrate)["NUMPARITY_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://") and "@db:" in url, url
    assert "${POSTGRES_PASSWORD" in url
    assert "ports" not in server, "a replica is reached through the proxy only"
    command = command_of(server)
    assert command[command.index("--port") + 1] == "8000"
    assert command[command.index("--host") + 1] == "0.0.0.0"


def test_only_the_proxy_publishes_a_port() -> None:
    published = {name for name, service in services().items() if service.get("ports")}
    assert published == {"proxy"}
    proxy = services()["proxy"]
    assert len(proxy["ports"]) == 1
    assert interpolate(str(proxy["ports"][0])).endswith(":80")
    assert proxy["image"].startswith("nginx:") and "alpine" in proxy["image"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in proxy["volumes"]}
    assert mounts.get("./deploy/nginx.conf") == "/etc/nginx/nginx.conf"
    assert set(depends_on(proxy)) == set(REPLICAS)


def _docker_compose() -> list[str] | None:
    """``docker compose`` (the plugin) or ``docker-compose``, if either answers."""
    for command in (["docker", "compose"], ["docker-compose"]):
        if not shutil.which(command[0]):
            continue
        try:
            done = subprocess.run([*command, "version"], capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return command
    return None


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    """`docker compose config` parses and validates the file (no engine needed)."""
    command = _docker_compose()
    if command is None:
        pytest.skip("neither `docker compose` (plugin) nor `docker-compose` is installed: the "
                    "compose file is checked by PyYAML only")
    env = {**os.environ, **TEST_ENV}
    done = subprocess.run([*command, "-f", str(COMPOSE), "config", "--format", "json"],
                          env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    resolved = json.loads(done.stdout)["services"]
    assert resolved["server-1"]["depends_on"]["migrate"]["condition"] == \
        "service_completed_successfully"
    missing = subprocess.run([*command, "-f", str(COMPOSE), "config", "-q"],
                             env={k: v for k, v in os.environ.items()
                                  if k != "POSTGRES_PASSWORD"},
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert missing.returncode != 0 and "POSTGRES_PASSWORD" in missing.stderr


# -- deploy/nginx.conf --------------------------------------------------------------------


def nginx_conf() -> str:
    """The configuration without its comments."""
    return re.sub(r"#[^\n]*", "", NGINX_CONF.read_text())


def _size(text: str) -> int:
    units = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    number, unit = re.fullmatch(r"(\d+)([kmgKMG]?)", text).groups()  # type: ignore[union-attr]
    return int(number) * units[unit.lower()]


def _locations(conf: str) -> dict[str, str]:
    """``location [=] PATH { ... }`` → {"[=] PATH": body} (bodies hold no braces here)."""
    return {m.group(1).strip(): m.group(2)
            for m in re.finditer(r"location\s+([^{]+)\{([^{}]*)\}", conf)}


def test_proxy_upstream_names_both_replicas() -> None:
    upstreams = upstream_servers(nginx_conf())
    assert len(upstreams) == 1, upstreams
    ((name, servers),) = upstreams.items()
    assert sorted(servers) == sorted(f"{replica}:8000" for replica in REPLICAS)
    assert set(REPLICAS) <= set(services())
    for location, body in _locations(nginx_conf()).items():
        assert f"proxy_pass http://{name};" in body, location


def test_proxy_body_limit_covers_the_servers() -> None:
    limits = re.findall(r"client_max_body_size\s+(\S+);", nginx_conf())
    assert limits, "client_max_body_size is unset (nginx's default is 1 MiB)"
    assert all(_size(limit) >= Settings().max_body_bytes for limit in limits), limits
    assert not re.search(r"proxy_request_buffering\s+off", nginx_conf()), \
        "a body must be buffered to be retried on the other replica"
    assert not re.search(r"proxy_set_header\s+(Authorization|Content-Encoding)\s+\"\"",
                         nginx_conf())
    assert re.search(r"proxy_set_header\s+Authorization\s+\$http_authorization;",
                     nginx_conf())


def test_proxy_retries_only_idempotent_requests() -> None:
    conf = nginx_conf()
    locations = _locations(conf)
    assert "proxy_next_upstream" in conf
    retried = {location for location, body in locations.items()
               if re.search(r"proxy_next_upstream\s[^;]*\bnon_idempotent\b", body)}
    # POST /runs is idempotent on run_id; /fingerprints/missing only reads.
    assert retried == {"= /api/v1/runs", "= /api/v1/fingerprints/missing"}, retried
    assert re.search(r"proxy_next_upstream\s+error\b", locations["/"])
    assert not re.search(r"non_idempotent", re.sub(r"location[^{]+\{[^{}]*\}", "", conf)), \
        "non_idempotent outside the upload locations would resend every POST"


def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    nginx = find_nginx()
    if nginx is None:
        pytest.skip(NO_NGINX)
    conf = render_for_loopback(tmp_path, listen_port=free_port(),
                               replicas={name: free_port() for name in REPLICAS})
    done = check_config(nginx, conf)
    assert done.returncode == 0, done.stderr


# -- Dockerfile and .dockerignore ---------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def instruction(keyword: str) -> list[str]:
    return [rest for kw, rest in dockerfile() if kw == keyword]


def test_dockerfile_base_and_user() -> None:
    assert instruction("FROM")[-1].startswith("python:3.11-slim")
    keywords = [kw for kw, _ in dockerfile()]
    last_from = len(keywords) - 1 - keywords[::-1].index("FROM")
    users = [i for i, kw in enumerate(keywords) if kw == "USER" and i > last_from]
    assert users and users[-1] < keywords.index("CMD"), "USER before CMD"
    user = dockerfile()[users[-1]][1].split(":")[0]
    assert user not in ("root", "0"), user
    assert re.search(rf"useradd\b.*--uid {user}\b", " ".join(instruction("RUN"))), \
        "a fixed uid, created in the image"


def test_dockerfile_installs_the_server_extra_only() -> None:
    runs = " ".join(instruction("RUN"))
    assert re.search(r"pip install\s+[\"']?\.\[server\][\"']?", runs), runs
    assert "torch" not in runs.lower()
    assert "optional-dependencies']['server']" in runs
    from tomllib import loads

    project = loads((REPO / "pyproject.toml").read_text())["project"]
    installed = project["dependencies"] + project["optional-dependencies"]["server"]
    assert not [d for d in installed if d.lower().startswith("torch")], installed


def test_dockerfile_copies_dependencies_before_code() -> None:
    copies = [rest.split() for rest in instruction("COPY")]
    sources = [source for parts in copies for source in parts[:-1]]
    for source in sources:
        assert (REPO / source).exists(), source
        assert not dockerignored(source), f"{source} is copied but .dockerignore excludes it"
    first_code = next(i for i, parts in enumerate(copies) if parts[0] == "server")
    metadata = next(i for i, parts in enumerate(copies) if "pyproject.toml" in parts)
    assert metadata < first_code
    assert {"agent", "server", "migrations", "setup.py", "README.md"} <= set(sources)


def test_dockerfile_copies_every_licence_file_the_build_needs() -> None:
    """pyproject's license-files patterns must each match a copied file: one that
    matches nothing fails the image's `pip install` (a setuptools deprecation today)."""
    from tomllib import loads

    sources = [source for rest in instruction("COPY") for source in rest.split()[:-1]]
    patterns = loads((REPO / "pyproject.toml").read_text())["project"]["license-files"]
    for pattern in patterns:
        found = [f.relative_to(REPO).as_posix() for f in REPO.glob(pattern)]
        copied = [f for f in found if any(f == s or f.startswith(f"{s}/") for s in sources)]
        assert copied, f"license-files {pattern!r}: none of {found} is copied into the image"


def test_dockerfile_healthcheck_cmd_and_port() -> None:
    (healthcheck,) = instruction("HEALTHCHECK")
    assert "/readyz" in healthcheck and "CMD" in healthcheck
    assert instruction("EXPOSE") == ["8000"]
    (cmd,) = instruction("CMD")
    assert json.loads(cmd) == ["numparity-server", "serve", "--host", "0.0.0.0",
                               "--port", "8000"]


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context (last match wins;
    a path inside an excluded folder is excluded)."""
    rules = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
             if line.strip() and not line.startswith("#")]

    def matches(pattern: str, candidate: str) -> bool:
        regex = re.escape(pattern.strip("/")).replace(r"\*\*/", "(.*/)?").replace(
            r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        return re.fullmatch(regex, candidate) is not None

    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        if any(matches(pattern, prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


@pytest.mark.parametrize("path", [".venv", ".venv/bin/python", "tests", "tests/conftest.py",
                                  "spool", "agent/spool/x.json", "screenshots",
                                  "tests/browser/screenshots/a.png", "numparity.db",
                                  "bench/x.db", ".git", "build", "numparity.egg-info", ".env"])
def test_dockerignore_excludes(path: str) -> None:
    assert dockerignored(path)


@pytest.mark.parametrize("path", ["pyproject.toml", "setup.py", "README.md",
                                  "server/app.py", "agent/_cli.py", "migrations/env.py"])
def test_dockerignore_keeps_what_the_build_needs(path: str) -> None:
    assert not dockerignored(path)


# -- the commands they run, against the real CLI ------------------------------------------


def server_commands() -> dict[str, list[str]]:
    """Every `numparity-server ...` the deployment files run, by where it is."""
    found = {"Dockerfile CMD": json.loads(instruction("CMD")[0])}
    for name, service in services().items():
        if "command" in service and command_of(service)[0] == "numparity-server":
            found[f"compose {name}"] = command_of(service)
    exec_start = systemd_unit()["Service"]["ExecStart"]
    words = shlex.split(exec_start)
    assert Path(words[0]).name == "numparity-server", exec_start
    found["systemd ExecStart"] = ["numparity-server", *words[1:]]
    return found


@cache
def _help(subcommand: str) -> str:
    done = subprocess.run([*server_command(), subcommand, "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_commands_exist_in_the_cli() -> None:
    commands = server_commands()
    assert {"Dockerfile CMD", "compose migrate", "compose server-1", "compose server-2",
            "systemd ExecStart"} <= set(commands)
    for where, command in commands.items():
        subcommand, args = command[1], command[2:]
        help_text = _help(subcommand)
        for flag in (a for a in args if a.startswith("--")):
            assert re.search(rf"(^|\s){re.escape(flag)}\b", help_text), \
                f"{where}: `{subcommand}` has no {flag}:\n{help_text}"
        parsed = _parser().parse_args(command[1:])  # exits (SystemExit) on a wrong value
        assert parsed.command == subcommand
        if subcommand == "serve":
            assert parsed.workers >= 1


# -- the healthcheck, run for real --------------------------------------------------------


def healthcheck_argv(base_url: str) -> list[str]:
    """The Dockerfile's HEALTHCHECK command against ``base_url`` instead of :8000."""
    (healthcheck,) = instruction("HEALTHCHECK")
    argv = json.loads(healthcheck[healthcheck.index("CMD") + 3:].strip())
    assert argv[0] == "python"
    compose_argv = services()["server-1"]["healthcheck"]["test"]
    assert compose_argv[1:] == argv, "the compose file runs the image's healthcheck"
    return [sys.executable, *[a.replace("http://127.0.0.1:8000", base_url) for a in argv[1:]]]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_healthcheck_passes_only_when_ready(live_server: Any, tmp_path: Path) -> None:
    ready = subprocess.run(healthcheck_argv(live_server.base_url), capture_output=True,
                           timeout=30)
    assert ready.returncode == 0, ready.stderr
    gone = subprocess.run(healthcheck_argv(f"http://127.0.0.1:{free_port()}"),
                          capture_output=True, timeout=30)
    assert gone.returncode != 0
    # A database not migrated: /readyz answers 503, the check fails.
    log_path = tmp_path / "unmigrated.log"
    env = {**os.environ, "NUMPARITY_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}",
           "NUMPARITY_MIGRATE_ON_START": "false"}
    process, base_url = start_server(log_path, env, "--log-level", "warning")
    try:
        wait_ready(base_url, process, log_path, path="/healthz")
        unready = subprocess.run(healthcheck_argv(base_url), capture_output=True, timeout=30)
        assert unready.returncode != 0
        assert b"503" in unready.stderr
    finally:
        stop_process(process)


# -- deploy/systemd/numparity-server.service ----------------------------------------------


@cache
def systemd_unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(SYSTEMD_UNIT.read_text())
    return parser


def test_systemd_unit_parses_and_serves() -> None:
    unit = systemd_unit()
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    service = unit["Service"]
    assert service["User"] not in ("root", "0")
    assert service["Restart"] in ("on-failure", "always")
    assert service["EnvironmentFile"].startswith("/")
    words = shlex.split(service["ExecStart"])
    assert words[0].startswith("/"), "systemd wants an absolute ExecStart"
    assert words[1] == "serve"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
