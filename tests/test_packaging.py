"""The distribution as a user installs it: a wheel, in a fresh virtual environment.

The wheel is built as `python -m build` builds a release: an sdist, then the wheel from
the unpacked sdist, so a file the sdist forgets is missing from the wheel too.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel (built from the sdist) and everything the build printed."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=False, capture_output=True, text=True,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    (built,) = out.glob("numparity-*.whl")
    return built, output


@pytest.fixture(scope="module")
def wheel(build: tuple[Path, str]) -> Path:
    return build[0]


def test_the_build_prints_no_warning_about_the_projects_packaging(build: tuple[Path, str]):
    """What `pip install -e .` (`make venv`) showed: three setuptools deprecation walls
    (`project.license` as a table) and three "Package would be ignored" walls (the
    dashboard's data folders were not packages)."""
    _wheel, output = build
    assert "deprecated" not in output.lower()
    assert "would be ignored" not in output
    # `build` prints the backend's warnings as "WARNING ..." lines.
    assert [line for line in output.splitlines() if line.startswith("WARNING")] == []


def test_wheel_carries_the_spdx_licence_and_the_licence_files(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode()
    assert "License-Expression: Apache-2.0" in headers
    licences = [n.split(".dist-info/licenses/", 1)[1] for n in names
                if ".dist-info/licenses/" in n]
    assert "LICENSE" in licences
    for vendored in ("uPlot.LICENSE", "swagger-ui.LICENSE", "swagger-ui.NOTICE",
                     "redoc.LICENSE"):
        assert f"server/dashboard/static/vendor/{vendored}" in licences, vendored


def test_wheel_maps_the_folders_to_their_import_names(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "numparity_agent/__init__.py" in names
    # The benchmarks' measured coverage and false alarms, which check and the audit state.
    assert "numparity_agent/proof_of_catch.json" in names
    assert not any("__pycache__" in n for n in names)
    assert "numparity_server/__init__.py" in names
    assert "numparity_server/migrations/env.py" in names
    assert any(n.startswith("numparity_server/migrations/versions/") and n.endswith(".py")
               and not n.endswith("__init__.py") for n in names)
    # The dashboard's pages, the chart library and the OpenAPI pages' libraries it
    # serves (no CDN), with their licences.
    assert "numparity_server/migrations/script.py.mako" in names
    for name in ("templates/overview.html", "templates/compare.html", "static/dashboard.js",
                 "static/dashboard.css", "templates/base.html",
                 "static/vendor/uPlot.iife.min.js", "static/vendor/uPlot.LICENSE",
                 "static/vendor/swagger-ui-bundle.js", "static/vendor/swagger-ui.css",
                 "static/vendor/swagger-ui-favicon-32x32.png",
                 "static/vendor/swagger-ui.LICENSE", "static/vendor/swagger-ui.NOTICE",
                 "static/vendor/swagger-ui-bundle.js.LICENSE.txt",
                 "static/vendor/redoc.standalone.js", "static/vendor/redoc.LICENSE",
                 "static/vendor/redoc.standalone.js.LICENSE.txt"):
        assert f"numparity_server/dashboard/{name}" in names, name
    # Bare names would collide with user code in the environments the agent lives in.
    assert not any(n.startswith(("agent/", "server/", "migrations/")) for n in names)


def test_wheel_carries_the_manual_the_server_serves(wheel: Path) -> None:
    """A lab's server has no internet: the dashboard's help links open the manual the
    package carries, built from docs/ into numparity_server/manual/."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for page in ("index.html", "reference/dashboard/index.html", "design/index.html",
                 "reference/cli-agent/index.html", "reference/settings/index.html",
                 "search/search_index.json"):
        assert f"numparity_server/manual/{page}" in names, page
    # Material's own scripts and styles, from the package: nothing from a CDN.
    assert any(n.startswith("numparity_server/manual/assets/javascripts/bundle.")
               for n in names)
    html = zipfile.ZipFile(wheel).read("numparity_server/manual/index.html").decode()
    assert "fonts.googleapis" not in html and 'src="http' not in html


def test_installed_wheel_migrates_an_empty_sqlite_database(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        check=True,
    )
    # The server's dependencies come from this test environment's site-packages through a
    # .pth line; .pth files found there are not executed, so the editable install of the
    # checkout stays invisible and the code that runs is the wheel's.
    site = Path(sysconfig.get_paths()["purelib"])
    fresh_site = next((env_dir / "lib").glob("python3*/site-packages"))
    (fresh_site / "numparity-test-deps.pth").write_text(f"{site}\n")

    where = subprocess.run(
        [str(python), "-c", "import numparity_server; print(numparity_server.__file__)"],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert where.startswith(str(env_dir)), where

    # The installed server finds the manual its wheel carries (served at /manual/).
    found = subprocess.run(
        [str(python), "-c", "from numparity_server.dashboard.manual import manual_folder\n"
         "from numparity_server.kit.settings import Settings\n"
         "print(manual_folder(Settings()))"],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert found.startswith(str(env_dir)) and Path(found, "index.html").is_file(), found

    database = tmp_path / "fresh.db"
    subprocess.run(
        [str(env_dir / "bin" / "numparity-server"), "--database-url", f"sqlite:///{database}",
         "migrate"],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    with sqlite3.connect(database) as db:
        tables = {row[0] for row in db.execute("select name from sqlite_master where type='table'")}
    assert {"nodes", "environments", "runs", "results", "manifests", "fingerprints", "latest",
            "tokens", "alembic_version"} <= tables


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_venv_says_what_it_installs_and_shows_pips_progress(tmp_path: Path) -> None:
    """`make venv` (and so `make demo` the first time) was a silent minute or more."""
    venv_dir = tmp_path / "venv"
    (venv_dir / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    # The environment's python, stood in for: it records what make asks of pip.
    python = venv_dir / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    python.chmod(0o755)
    done = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "venv",
                           f"VENV={venv_dir}"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    stages = [line for line in done.stdout.splitlines() if line.startswith("==> ")]
    assert [s.split("]")[0] for s in stages[:4]] == [f"==> [{n}/4" for n in range(1, 5)]
    assert "torch 2.13.0" in stages[2] and "numparity" in stages[3]
    assert stages[-1] == f"==> {venv_dir} is ready"
    installs = calls.read_text().splitlines()
    assert installs[-2:] == ["-m pip install torch==2.13.0",
                             "-m pip install -e .[agent,server,dev,browser]"]  # not --quiet
    assert (venv_dir / ".numparity-installed").exists()
