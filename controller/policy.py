"""`spec.rightsizing` of an ElasticModel: how a model's budget follows its usage.

Owns the policy's fields, their documented defaults and the parsing of durations
(`90s`, `5m`, `6h`, `1d`). The schema (schemas/elasticmodel.schema.json) checks shape
and ranges first; `parse_policy` builds the value the recommender reads and reports what
the schema cannot see (minBudget above maxBudget). It sits below controller.types (an
ElasticModel carries its policy); parsed by controller.inputs.load, read by controller.rightsizing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from contract.quantity import parse_bytes

Policy = Literal["Off", "Recommend", "Auto"]
_DURATION = re.compile(r"^([0-9]+)(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}

DEFAULT_POLICY: Policy = "Recommend"
DEFAULT_HEADROOM_PERCENT = 15.0
DEFAULT_UPSIZE_AFTER_S = 60          # a breach held this long (4 scrapes at 15 s) is sustained
DEFAULT_DOWNSIZE_AFTER_S = 86400     # a full day below target: one diurnal cycle is always in the window
DEFAULT_COOLDOWN_S = 6 * 3600        # no downsize within this long after any change
HALF_LIFE_S = 86400                  # the decaying histogram's half-life (as the Vertical Pod Autoscaler)
PERCENTILE = 0.99                    # the usage percentile the target starts from
DOWNSIZE_MARGIN = 0.10               # a downsize must free at least this share of the budget (no flapping)
KV_NEAR_FRACTION = 0.90              # KV in use at or above this share of its reservation is a breach


class PolicyError(ValueError):
    """A rightsizing field the schema accepts but that makes no sense (minBudget above maxBudget)."""

    reason = "InvalidRightsizing"


def parse_duration(text: str) -> int:
    """Seconds in `90s`, `5m`, `6h` or `1d`."""
    match = _DURATION.match(str(text).strip())
    if not match:
        raise PolicyError(f"{text!r} is not a duration; write a whole number with s, m, h or d, e.g. 5m or 1d")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


@dataclass(frozen=True)
class Rightsizing:
    policy: Policy = "Off"
    headroom_percent: float = DEFAULT_HEADROOM_PERCENT
    min_budget: int | None = None
    max_budget: int | None = None
    upsize_after_s: int = DEFAULT_UPSIZE_AFTER_S
    downsize_after_s: int = DEFAULT_DOWNSIZE_AFTER_S
    cooldown_s: int = DEFAULT_COOLDOWN_S

    @property
    def enabled(self) -> bool:
        return self.policy != "Off"

    def clamp(self, nbytes: int) -> int:
        if self.max_budget is not None:
            nbytes = min(nbytes, self.max_budget)
        if self.min_budget is not None:
            nbytes = max(nbytes, self.min_budget)
        return nbytes


OFF = Rightsizing()


def parse_policy(spec: dict | None) -> Rightsizing:
    """The Rightsizing of a schema-valid `spec.rightsizing` mapping (None: Off)."""
    if spec is None:
        return OFF
    low = parse_bytes(spec["minBudget"]) if "minBudget" in spec else None
    high = parse_bytes(spec["maxBudget"]) if "maxBudget" in spec else None
    if low is not None and high is not None and low > high:
        raise PolicyError(f"minBudget ({spec['minBudget']}) is above maxBudget ({spec['maxBudget']}); "
                          "swap them or widen the range")
    return Rightsizing(
        policy=spec.get("policy", DEFAULT_POLICY),
        headroom_percent=float(spec.get("headroomPercent", DEFAULT_HEADROOM_PERCENT)),
        min_budget=low,
        max_budget=high,
        upsize_after_s=parse_duration(spec.get("upsizeAfter", f"{DEFAULT_UPSIZE_AFTER_S}s")),
        downsize_after_s=parse_duration(spec.get("downsizeAfter", f"{DEFAULT_DOWNSIZE_AFTER_S}s")),
        cooldown_s=parse_duration(spec.get("cooldown", f"{DEFAULT_COOLDOWN_S}s")),
    )
