"""List scheduling: the state a list scheduler keeps, and the CRITICAL PATH and HEFT rules over it.

- :mod:`~doppler.listsched.state`: the list-schedule state shared by the CRITICAL PATH teacher and
  the learned policy (estimated starts, placement, the candidate set, HEFT's busy intervals) and
  the policy's device features computed from it;
- :mod:`~doppler.listsched.rules`: CRITICAL PATH's rule (SEL: largest b-level; PLC: smallest
  estimated start, ties within :data:`TIE_RTOL`) and HEFT's (earliest finish with insertion), and
  their compiled completions of a partial schedule.

The methods ``critical_path``, ``heft``, ``lookahead`` and ``heft_lookahead`` and the policy's rule
decode all call these, so no rule is written twice.
"""

from doppler.listsched.rules import (
    TIE_RTOL,
    critical_path_completion,
    earliest_start_device,
    empty_schedule,
    heft_completion,
    heft_list_schedule,
    heft_place,
    largest_key_candidate,
    tied,
)
from doppler.listsched.state import (
    DEVICE_FEATURES,
    LIST_SCHEDULES,
    NUM_DEVICE_FEATURES,
    PlacementState,
    earliest_gap,
    empty_state,
    est_into,
    features_into,
    gaps_into,
    heft_features_into,
    init_candidates,
    insert_busy,
    insert_interval,
    insertion_starts_into,
    place,
    pred_comm_s,
    take_candidate,
)

__all__ = [
    "DEVICE_FEATURES",
    "LIST_SCHEDULES",
    "NUM_DEVICE_FEATURES",
    "PlacementState",
    "TIE_RTOL",
    "critical_path_completion",
    "earliest_gap",
    "earliest_start_device",
    "empty_schedule",
    "empty_state",
    "est_into",
    "features_into",
    "gaps_into",
    "heft_completion",
    "heft_features_into",
    "heft_list_schedule",
    "heft_place",
    "init_candidates",
    "insert_busy",
    "insert_interval",
    "insertion_starts_into",
    "largest_key_candidate",
    "place",
    "pred_comm_s",
    "take_candidate",
    "tied",
]
