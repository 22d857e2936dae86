"""A Python where only the agent is installed: the server's packages (the `server`
extra and the server itself) cannot be imported. Every process started with this folder
on PYTHONPATH gets ModuleNotFoundError for them, as a node with `pip install
'numparity[agent]'` would (tests/agent/test_agent_tests_alone.py)."""

import importlib.abc
import sys

SERVER_PACKAGES = frozenset({
    "numparity_server", "fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic",
    "psycopg", "psycopg_pool", "pydantic", "pydantic_core", "pydantic_settings", "jinja2",
    "multipart", "prometheus_client", "orjson",
})


class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in SERVER_PACKAGES:
            raise ModuleNotFoundError(f"No module named {name!r} (only the agent is "
                                      "installed here)", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
