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
"""

from setuptools import find_namespace_packages, setup

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


setup(
    packages=_packages(),
    package_dir=ROOTS,
    package_data={
        # The dashboard's templates and static files; the vendored libraries (uPlot,
        # Swagger UI, ReDoc) with their licences and notices, and Swagger UI's favicon.
        "numparity_server": ["**/*.html", "**/*.js", "**/*.css", "**/*.png", "**/*.LICENSE",
                             "**/*.LICENSE.txt", "**/*.NOTICE"],
        "numparity_server.migrations": ["*.mako"],
    },
)
