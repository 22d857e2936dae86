"""Every dependency alias a route needs, in one place."""

from numparity_server.auth.deps import AdminAuth, AgentAuth, ReaderAuth
from numparity_server.kit.deps import DbSession, SettingsDep
from numparity_server.kit.policy import PolicyDep

__all__ = ["AdminAuth", "AgentAuth", "DbSession", "PolicyDep", "ReaderAuth", "SettingsDep"]
