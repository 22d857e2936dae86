"""deploy/nginx.conf on this machine: the compose file's proxy without Docker.

When an nginx binary is installed (``nginx`` on the PATH, or ``NUMPARITY_NGINX``), the
tests check the configuration with ``nginx -t`` and run it in front of real server
processes. Outside Docker the replicas' names (``server-1``, ``server-2``) are loopback
ports, so the copy these helpers write replaces them, listens on a loopback port and keeps
its temporary files in a test directory; everything else is the file as shipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NGINX_CONF = REPO / "deploy" / "nginx.conf"
TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def find_nginx() -> str | None:
    configured = os.environ.get("NUMPARITY_NGINX")
    if configured:
        return configured
    found = shutil.which("nginx")
    if found:
        return found
    for candidate in ("/usr/sbin/nginx", "/usr/local/sbin/nginx"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


NO_NGINX = ("nginx is not installed (`apt-get install nginx`, or NUMPARITY_NGINX=/path/to/nginx):"
            " deploy/nginx.conf is only checked for its structure")


def upstream_servers(conf: str) -> dict[str, list[str]]:
    """``upstream NAME { server HOST:PORT ...; }`` → {NAME: ["HOST:PORT", ...]}."""
    upstreams = {}
    for match in re.finditer(r"^\s*upstream\s+(\S+)\s*\{(.*?)^\s*\}", conf, re.S | re.M):
        servers = re.findall(r"^\s*server\s+(\S+)", match.group(2), re.M)
        upstreams[match.group(1)] = servers
    return upstreams


def render_for_loopback(workdir: Path, *, listen_port: int,
                        replicas: dict[str, int]) -> Path:
    """A copy of deploy/nginx.conf in ``workdir``: ``replicas`` ({compose service name:
    loopback port}) instead of the service names, listening on ``listen_port``."""
    conf = NGINX_CONF.read_text()
    for name, port in replicas.items():
        conf, count = re.subn(rf"\bserver\s+{re.escape(name)}:8000\b",
                              f"server 127.0.0.1:{port}", conf)
        assert count == 1, f"no `server {name}:8000` in {NGINX_CONF}"
    # `resolve` re-resolves a name through Docker's DNS (nginx >= 1.27.3); an address
    # needs none.
    conf = re.sub(r"(\bserver\s+127\.0\.0\.1:\d+)\s+resolve\b", r"\1", conf)
    conf, count = re.subn(r"^(\s*)listen\s+80;", rf"\1listen 127.0.0.1:{listen_port};", conf,
                          flags=re.M)
    assert count == 1, f"no `listen 80;` in {NGINX_CONF}"
    temp = "".join(f"    {kind}_temp_path {workdir / kind};\n" for kind in TEMP_PATHS)
    conf = conf.replace("http {\n", "http {\n" + temp, 1)
    path = workdir / "nginx.conf"
    path.write_text(conf)
    return path


def nginx_command(nginx: str, conf: Path, *args: str) -> list[str]:
    workdir = conf.parent
    # Run as root (CI), nginx's workers would be "nobody", who cannot write the request
    # bodies it buffers to disk (over client_body_buffer_size) into the test's 0700
    # folder: they stay root.
    user = " user root;" if os.geteuid() == 0 else ""
    return [nginx, "-p", str(workdir), "-e", "stderr", "-c", str(conf),
            "-g", f"pid {workdir / 'nginx.pid'}; daemon off;{user}", *args]


def check_config(nginx: str, conf: Path) -> subprocess.CompletedProcess:
    return subprocess.run(nginx_command(nginx, conf, "-t"), capture_output=True, text=True,
                          timeout=30)
