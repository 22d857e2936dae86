"""Pure analysis of fingerprints and environments (design §3.3): numpy only.

No database and no web framework here: the repository layer feeds these functions plain
values, so they can be tested with hand-made fleets and reused by a CLI.
"""

from ._arrays import decode_array, encode_array
from ._json import json_safe
from .attribution import rank_attributes, separating_attributes
from .bitflip import single_bit_flip
from .closeness import SEMANTICS, semantics_of
from .compare import METRICS, VERDICTS, Comparison, compare
from .consensus import Support, broken_inputs, fleet_inputs, tally, usual
from .environment import (
    IDENTITY_KEYS,
    UNSET,
    environment_diff,
    flatten_environment,
    short_difference,
)
from .fingerprint import Fingerprint, StoredValues, fingerprint_from_wire
from .groups import (
    Answer,
    Counted,
    Group,
    Member,
    counted,
    group_answers,
    group_members,
    members_page,
)
from .judge import Judgement, judge
from .layers import compare_manifests, first_divergent_layer, first_nonfinite, largest_jump
from .origin import Origins, no_trace_note, origin_ops
from .pairs import COMPARISON_VERSION, ORIGIN, ComparisonRecord, origin_key_of
from .report import (
    PENDING,
    DivergencePlan,
    PairsMode,
    divergence_report,
    plan_divergence,
    plan_groups,
)
from .result_pair import (
    ROWS,
    SUMMARY,
    PartComparison,
    compare_part,
    part_bounds,
    result_pair_key,
    summarize,
)
from .tolerance import DEFAULT_TOLERANCES, Tolerance, default_tolerance
from .trace import Trace, trace_from_body
from .ulp import ulp_distance
from .verdicts import SEVERITY, ResultVerdict, result_verdict, worst_verdict

__all__ = [
    "COMPARISON_VERSION",
    "DEFAULT_TOLERANCES",
    "IDENTITY_KEYS",
    "METRICS",
    "SEMANTICS",
    "SEVERITY",
    "UNSET",
    "VERDICTS",
    "Answer",
    "Comparison",
    "ComparisonRecord",
    "Counted",
    "DivergencePlan",
    "Fingerprint",
    "StoredValues",
    "Group",
    "Judgement",
    "Member",
    "Origins",
    "PairsMode",
    "Support",
    "ResultVerdict",
    "Tolerance",
    "Trace",
    "broken_inputs",
    "fleet_inputs",
    "compare",
    "compare_manifests",
    "counted",
    "decode_array",
    "default_tolerance",
    "divergence_report",
    "encode_array",
    "environment_diff",
    "first_divergent_layer",
    "single_bit_flip",
    "first_nonfinite",
    "fingerprint_from_wire",
    "flatten_environment",
    "group_answers",
    "group_members",
    "members_page",
    "json_safe",
    "judge",
    "largest_jump",
    "no_trace_note",
    "origin_ops",
    "plan_divergence",
    "plan_groups",
    "rank_attributes",
    "result_verdict",
    "separating_attributes",
    "short_difference",
    "tally",
    "trace_from_body",
    "semantics_of",
    "ulp_distance",
    "usual",
    "worst_verdict",
    "ORIGIN",
    "origin_key_of",
    "PENDING",
    "ROWS",
    "SUMMARY",
    "PartComparison",
    "compare_part",
    "part_bounds",
    "result_pair_key",
    "summarize",
]
