"""The manual (mkdocs.yml, docs/): its strict build and its reference generator.

``built_manual()`` builds the manual strictly once per test session (a few seconds) for
every test that reads or serves it: tests/docs, the server's /manual/, the browser.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
GENERATOR = DOCS / "_gen" / "reference.py"


def build_manual(site_dir: Path, *, root: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``root``'s mkdocs.yml into ``site_dir``, as ``make docs``
    runs it."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(root / "mkdocs.yml"), "--site-dir", str(site_dir)],
        capture_output=True, text=True, timeout=300, cwd=root,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


@functools.cache
def built_manual() -> Path:
    """The checkout's manual, built strictly once per session (removed at exit)."""
    folder = Path(tempfile.mkdtemp(prefix="numparity-manual-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    done = build_manual(folder / "site")
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    return folder / "site"


def page_file(site: Path, source: str) -> Path:
    """The built file of the page ``source`` (``how-to/retention.md`` →
    ``how-to/retention/index.html``, as MkDocs' directory URLs lay it out)."""
    stem = Path(source).with_suffix("")
    return site / (stem.parent if stem.name == "index" else stem) / "index.html"


@functools.cache
def reference_generator() -> ModuleType:
    """docs/_gen/reference.py, imported (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("numparity_docs_reference", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
