"""The distribution as a user installs it: a wheel, in a fresh virtual environment."""

from __future__ import annotations

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
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out),
         str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    (built,) = out.glob("numparity-*.whl")
    return built


def test_wheel_maps_the_folders_to_their_import_names(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "numparity_agent/__init__.py" in names
    assert "numparity_server/__init__.py" in names
    assert "numparity_server/migrations/env.py" in names
    assert any(n.startswith("numparity_server/migrations/versions/") and n.endswith(".py")
               and not n.endswith("__init__.py") for n in names)
    # The dashboard's pages, the chart library and the OpenAPI pages' libraries it
    # serves (no CDN), with their licences.
    for name in ("templates/overview.html", "templates/compare.html", "static/dashboard.js",
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
