"""The server never imports torch (design §1): it runs where no ML stack is installed."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import importlib, pkgutil, sys
import numparity_server
for module in pkgutil.walk_packages(numparity_server.__path__, "numparity_server."):
    importlib.import_module(module.name)
from numparity_server.app import create_app
from numparity_server.kit.settings import Settings
create_app(Settings())
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numparity_agent"))
print(" ".join(loaded))
"""


def test_no_server_module_imports_torch_or_the_agent(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "NUMPARITY_DATABASE_URL": f"sqlite:///{tmp_path}/x.db"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
