"""ORM models (design §3.1). Importing this package registers every table on ``Base``."""

from numparity_server.models.base import Base, UTCDateTime, utcnow
from numparity_server.models.comparisons import KeptComparison
from numparity_server.models.content import STAT_FIELDS, Fingerprint, Manifest, Trace
from numparity_server.models.explanations import Explanation
from numparity_server.models.fleet import Device, Environment, Node, stable_identity
from numparity_server.models.fleet_version import FLEET_VERSION_ROW, FleetVersion
from numparity_server.models.goldens import Golden, GoldenAnswer
from numparity_server.models.runs import Latest, LatestCount, Outcome, Result, Run
from numparity_server.models.tokens import Token
from numparity_server.models.uploads import UploadPart

__all__ = [
    "STAT_FIELDS",
    "Base",
    "Device",
    "stable_identity",
    "Environment",
    "Explanation",
    "FLEET_VERSION_ROW",
    "FleetVersion",
    "Fingerprint",
    "Golden",
    "GoldenAnswer",
    "KeptComparison",
    "Latest",
    "LatestCount",
    "Manifest",
    "Node",
    "Outcome",
    "Result",
    "Run",
    "Token",
    "Trace",
    "UTCDateTime",
    "UploadPart",
    "utcnow",
]
