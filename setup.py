"""Package mapping only; all metadata is in pyproject.toml.

Bare ``agent``/``server`` import names would collide with user code in the ML
environments the agent is installed into (design §1), so the folders are mapped to
``numparity_agent`` and ``numparity_server``. The Alembic environment in
``migrations/`` ships inside the server as ``numparity_server.migrations`` so an
installed server can migrate its own database.

Folders that hold only data (the dashboard's templates and static files) are packages
too: setuptools installs files from packages only, and warns ("Package would be
ignored") about data files in a folder that is not one, so every folder is found as a
namespace package.

A wheel also carries the manual, built from ``docs/`` with MkDocs (a build requirement,
pyproject.toml) into ``numparity_server/manual/``: the server serves it at ``/manual/``
on a lab network without internet (``server/dashboard/manual.py``). An editable install
does not build it.
"""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

ROOTS = {
    "numparity_agent": "agent",
    "numparity_server": "server",
    "numparity_server.migrations": "migrations",
}


def _packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        subs = find_namespace_packages(where=folder, exclude=["__pycache__", "*.__pycache__"])
        found += [f"{name}.{sub}" for sub in subs]
    return sorted(set(found))


class BuildWithManual(build_py):
    """build_py, then the manual into the package (``mkdocs build``, not strict: the
    tests build it strictly; a release never fails on a docs warning)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "numparity_server" / "manual"
        subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--quiet", "--config-file",
             "mkdocs.yml", "--site-dir", str(target.resolve())],
            check=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        )


setup(
    cmdclass={"build_py": BuildWithManual},
    packages=_packages(),
    package_dir=ROOTS,
    package_data={
        # The benchmarks' measured coverage and false alarms (`_proof`, issue 44).
        "numparity_agent": ["proof_of_catch.json"],
        # The dashboard's templates and static files; the vendored libraries (uPlot,
        # Swagger UI, ReDoc) with their licences and notices, and Swagger UI's favicon.
        "numparity_server": ["**/*.html", "**/*.js", "**/*.css", "**/*.png", "**/*.LICENSE",
                             "**/*.LICENSE.txt", "**/*.NOTICE"],
        "numparity_server.migrations": ["*.mako"],
    },
)
