"""The agent's settings: command line, then NUMPARITY_* variables, then a TOML file.

The file is `--config FILE`, else `NUMPARITY_CONFIG`, else `/etc/numparity/agent.toml`
when it exists. Its keys mirror the long options (`upload_timeout` for
`--upload-timeout`); an unknown key or a value of the wrong type is a usage error that
names it. Relative paths in the file are relative to the file's folder. Labels merge key
by key (file, then environment, then `--label`); every other setting is taken whole
from the first place that sets it.

The token: `--token`/`--token-file`, then `NUMPARITY_TOKEN`/`NUMPARITY_TOKEN_FILE`, then
`token`/`token_file` in the file. A token file that only root reads keeps the token out
of `ps` and of a config file that others read; the agent warns when the file holding the
token is readable by others.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DEFAULT_CONFIG = Path("/etc/numparity/agent.toml")
CONFIG_ENV = "NUMPARITY_CONFIG"

# key -> kind; a key's variable is NUMPARITY_<KEY upper-cased>.
KINDS: dict[str, str] = {
    "server": "url",
    "token": "str",
    "token_file": "path",
    "spool": "path",
    "node": "str",
    "labels": "labels",
    "suite": "str",
    "workloads": "list",
    "variants": "list",
    "repeats": "count",
    "device": "str",
    "timeout": "seconds",
    "upload_timeout": "seconds",
    "jitter": "delay",
    "ca_bundle": "path",
    "max_wait": "delay",
    "trace_ops": "flag",
    "study_budget": "seconds",
    # Inductor's cache folder for the compiled variant (`_compile.default_cache_dir`).
    "compile_cache": "path",
    # `check` when it cannot tell (server unreachable, unknown environment, out of time):
    # "open" lets the job start (exit 0), "closed" (default) exits with the cause's code.
    "check_fail": "fail",
}
# What a value of each kind is, in the file and in a variable (the manual's settings page
# says it; `_convert` checks it).
KIND_HELP: dict[str, str] = {
    "str": "a non-empty string",
    "url": "an http:// or https:// URL: the server's address, as its dashboard's "
           "(http://numparity.lab:8000), without /api/v1",
    "path": "a path; relative in the file: relative to the file's folder",
    "labels": "a [labels] table of key = \"value\"; in the variable k=v,k=v; merged key by "
              "key: file, then variable, then --label",
    "list": "names: a TOML list, or one string of names separated by commas or spaces",
    "count": "a whole number of at least 1",
    "seconds": "a number of seconds, more than 0",
    "delay": "a number of seconds, 0 or more",
    "flag": "true or false; in the variable also 1/0, yes/no, on/off",
    "fail": "open or closed: what `check` does when it cannot tell",
}
# How a flag is written in a NUMPARITY_* variable.
_FLAG_WORDS = {"1": True, "true": True, "yes": True, "on": True,
               "0": False, "false": False, "no": False, "off": False}


class ConfigError(ValueError):
    """A setting that cannot be used: the message names where it came from."""


@dataclass
class Resolved:
    """Each setting's value (None: not set anywhere) and where it came from."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.values.get(key)
        return default if value is None else value


def env_name(key: str) -> str:
    return "NUMPARITY_" + key.upper()


def option_name(key: str) -> str:
    """The command-line option of a key: ``--upload-timeout``; ``--label`` for labels."""
    return "--label" if key == "labels" else "--" + key.replace("_", "-")


def _toml_loads(text: str, path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ConfigError(f"reading the config file {path} needs Python 3.11 or the "
                              "tomli package (pip install tomli)") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _convert(kind: str, value: Any, where: str, base: Path | None) -> Any:
    """A value of `kind` from TOML (typed) or from a string (environment)."""
    if kind == "labels":
        if isinstance(value, str):
            return parse_labels(value.replace(",", " ").split(), where)
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table of key = \"value\"")
        bad = [k for k, v in value.items() if isinstance(v, (dict, list))]
        if bad:
            raise ConfigError(f"{where}: label {bad[0]} must be a string or a number")
        return {str(k): (str(v).lower() if isinstance(v, bool) else str(v))
                for k, v in value.items()}
    if kind == "list":
        if isinstance(value, str):
            items = value.replace(",", " ").split()
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            items = [n for v in value for n in v.replace(",", " ").split()]
        else:
            raise ConfigError(f"{where} must be a list of names")
        if not items:
            raise ConfigError(f"{where} is empty")
        return items
    if kind == "flag":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _FLAG_WORDS:
            return _FLAG_WORDS[value.strip().lower()]
        raise ConfigError(f"{where} must be true or false, not {value!r}")
    if kind in ("count", "seconds", "delay"):
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be a number, not {value!r}")
        try:
            number = int(value) if kind == "count" else float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be a{'n integer' if kind == 'count' else ' number'}"
                              f", not {value!r}") from None
        if kind == "count" and (number < 1 or number != value and not isinstance(value, str)):
            raise ConfigError(f"{where} must be a whole number of at least 1, not {value!r}")
        if kind == "seconds" and not number > 0:
            raise ConfigError(f"{where} must be more than 0 seconds, not {value!r}")
        if kind == "delay" and not number >= 0:
            raise ConfigError(f"{where} must be 0 seconds or more, not {value!r}")
        return number
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} must be a non-empty string")
    if kind == "fail":
        if value.strip().lower() not in ("open", "closed"):
            raise ConfigError(f"{where} must be open or closed, not {value!r}")
        return value.strip().lower()
    if kind == "url":
        return _url(value.strip(), where)
    if kind == "path":
        path = Path(value).expanduser()
        return base / path if base is not None and not path.is_absolute() else path
    return value


def _url(value: str, where: str) -> str:
    """The server's address: a URL with a scheme and a host. Without one httpx cannot
    send anything, which would look like a server that is down (kept, exit 3) on every
    run instead of the mistake it is."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        example = value if "://" in value else f"http://{value}"
        raise ConfigError(f"{where} must be an http:// or https:// URL such as "
                          f"http://numparity.lab:8000, not {value!r} (did you mean "
                          f"{example!r}?)")
    return value


def parse_labels(pairs: list[str], where: str) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{where} expects key=value, got {pair!r}")
        labels[key] = value
    return labels


def find_config(cli_value: str | None, environ: Mapping[str, str]) -> tuple[Path | None, bool]:
    """The config file to read and whether it was asked for (then it must exist)."""
    if cli_value:
        return Path(cli_value), True
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]), True
    return (DEFAULT_CONFIG, False) if DEFAULT_CONFIG.is_file() else (None, False)


def load_config(path: Path) -> dict[str, Any]:
    """The file's settings, checked and converted; ConfigError naming what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    raw = _toml_loads(text, path)
    unknown = sorted(set(raw) - set(KINDS))
    if unknown:
        raise ConfigError(f"config file {path}: unknown key {unknown[0]!r} "
                          f"(known: {', '.join(KINDS)})")
    base = path.resolve().parent
    return {key: _convert(KINDS[key], value, f"{key} in {path}", base)
            for key, value in raw.items()}


def _readable_by_others(path: Path) -> bool:
    try:
        return bool(path.stat().st_mode & (stat.S_IROTH | stat.S_IWOTH))
    except OSError:
        return False


def read_token_file(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"the token file {path} is not text") from None
    if not token or len(token.split()) != 1:
        raise ConfigError(f"the token file {path} must hold the token alone on one line")
    return token


def resolve(
    cli: Mapping[str, Any], environ: Mapping[str, str], config_path: str | None = None
) -> Resolved:
    """Every setting from `cli` (None: not given), then `environ`, then the config file."""
    path, explicit = find_config(config_path, environ)
    file_values: dict[str, Any] = {}
    if path is not None:
        if explicit and not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        file_values = load_config(path)
    resolved = Resolved()
    for key, kind in KINDS.items():
        if key in ("token", "token_file"):
            continue
        layers = [
            (_from_cli(kind, key, cli.get(key)), option_name(key)),
            (_from_env(kind, key, environ), env_name(key)),
            (file_values.get(key), f"{key} in {path}"),
        ]
        if kind == "labels":
            merged: dict[str, str] = {}
            for value, _where in reversed(layers):
                merged.update(value or {})
            resolved.values[key] = merged
            continue
        for value, where in layers:
            if value is not None:
                resolved.values[key] = value
                resolved.sources[key] = where
                break
    _resolve_token(resolved, cli, environ, file_values, path)
    return resolved


def _from_cli(kind: str, key: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "labels" and isinstance(value, list):
        return parse_labels(value, option_name(key))
    return _convert(kind, value, option_name(key), None)


def _from_env(kind: str, key: str, environ: Mapping[str, str]) -> Any:
    text = environ.get(env_name(key), "")
    if not text.strip():
        return None
    return _convert(kind, text, env_name(key), None)


def _resolve_token(resolved: Resolved, cli: Mapping[str, Any], environ: Mapping[str, str],
                   file_values: dict[str, Any], path: Path | None) -> None:
    token_file_env = environ.get(env_name("token_file"), "").strip()
    levels = [
        (cli.get("token"), "--token", cli.get("token_file"), "--token-file"),
        (environ.get(env_name("token")) or None, env_name("token"),
         Path(token_file_env) if token_file_env else None, env_name("token_file")),
        (file_values.get("token"), f"token in {path}",
         file_values.get("token_file"), f"token_file in {path}"),
    ]
    for token, token_where, token_file, file_where in levels:
        if token and token_file:
            raise ConfigError(f"both {token_where} and {file_where} are set: use one")
        if token:
            resolved.values["token"] = token
            resolved.sources["token"] = token_where
            if path is not None and token_where.startswith("token in") and \
                    _readable_by_others(path):
                resolved.warnings.append(
                    f"the config file {path} holds the agent token and others can read it: "
                    "put the token in a file only root reads and name it with token_file")
            return
        if token_file:
            token_path = Path(token_file)
            resolved.values["token"] = read_token_file(token_path)
            resolved.sources["token"] = f"{file_where} {token_path}"
            if _readable_by_others(token_path):
                resolved.warnings.append(
                    f"the token file {token_path} is readable by others: chmod 600 it")
            return

