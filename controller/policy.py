"""`spec.rightsizing` of an ElasticModel: how a model's budget follows its usage.

Owns the policy's fields, their documented defaults and the parsing of durations
(`90s`, `5m`, `6h`, `1d`). The schema (schemas/elasticmodel.schema.json) checks shape
and ranges first; `parse_policy` builds the value the recommender reads and reports what
the schema cannot see: limits that contradict each other or the model's own budget. The user's
`memoryBudget` must lie within [minBudget, maxBudget]: maxBudget below it, minBudget above it, or
minBudget above maxBudget is refused (PolicyError names the field and the fix), whatever the policy.
Equal bounds are allowed (a fixed budget the loop only reports on). It sits below controller.types (an
ElasticModel carries its policy); parsed by controller.inputs.load, read by controller.rightsizing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from contract import durations
from contract.quantity import parse_bytes, paste_quantity

Policy = Literal["Off", "Recommend", "Auto"]

DEFAULT_POLICY: Policy = "Recommend"
DEFAULT_HEADROOM_PERCENT = 15.0
DEFAULT_UPSIZE_AFTER_S = 60          # a breach held this long (4 scrapes at 15 s) is sustained
DEFAULT_DOWNSIZE_AFTER_S = 86400     # a full day below target: one diurnal cycle is always in the window
DEFAULT_COOLDOWN_S = 6 * 3600        # no downsize within this long after any change
HALF_LIFE_S = 86400                  # the decaying histogram's half-life (as the Vertical Pod Autoscaler)
PERCENTILE = 0.99                    # the usage percentile the target starts from
DOWNSIZE_MARGIN = 0.10               # a downsize freeing this share of the budget or more waits one cooldown;
                                     # a smaller one longer, in proportion (5 %: two cooldowns)
MIN_DOWNSIZE_SHARE = 0.02            # no downsize frees less than this share of the budget (no flapping)
KV_NEAR_FRACTION = 0.90              # KV in use at or above this share of its reservation is a breach
DEFAULT_WINDOW_S = 2 * 86400         # the usage each pass reads (--rightsize-window): two diurnal cycles
MAX_CHANGES_PER_DAY = 6              # budget changes per model in any 24 h; one more holds (ChangeCapReached)


class PolicyError(ValueError):
    """A rightsizing field the schema accepts but that makes no sense (limits that contradict each other or the
    budget); `path` names the field, `fix` what to write instead."""

    reason = "InvalidRightsizing"

    def __init__(self, message: str, path: str = "spec.rightsizing", fix: str = "") -> None:
        super().__init__(message)
        self.path, self.fix = path, fix or "correct spec.rightsizing"


def parse_duration(text: str) -> int:
    """Whole seconds in a duration (`90s`, `5m`, `6h`, `1d`: contract.durations' syntax)."""
    try:
        return math.ceil(durations.parse_duration(text))
    except ValueError as exc:
        raise PolicyError(str(exc)) from None


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


def check_limits(low: int | None, high: int | None, budget: int | None, spec: dict) -> None:
    """PolicyError when minBudget > maxBudget, maxBudget < memoryBudget or minBudget > memoryBudget: a loop that
    honoured both would have to leave the user's budget, or shrink below the usage it measured, because of a
    limit (docs/guide.md, Right-sizing)."""
    shown = {key: _quoted(spec.get(key)) for key in ("minBudget", "maxBudget")}
    if low is not None and high is not None and low > high:
        raise PolicyError(f"minBudget {shown['minBudget']} is above maxBudget {shown['maxBudget']}: no budget "
                          "satisfies both", "spec.rightsizing.minBudget",
                          f"set minBudget at most maxBudget: swap them, or raise maxBudget to at least "
                          f"{shown['minBudget']}")
    if budget is None:
        return
    if high is not None and high < budget:
        raise PolicyError(f"maxBudget {shown['maxBudget']} is below memoryBudget ({_size(budget)}): the loop could "
                          "only honour it by cutting the budget regardless of what the model uses",
                          "spec.rightsizing.maxBudget",
                          f"raise maxBudget to at least {_size(budget)}, or lower memoryBudget to {shown['maxBudget']} "
                          "yourself")
    if low is not None and low > budget:
        raise PolicyError(f"minBudget {shown['minBudget']} is above memoryBudget ({_size(budget)}): the loop could "
                          "only honour it by raising the budget without any breach", "spec.rightsizing.minBudget",
                          f"lower minBudget to at most {paste_quantity(budget, at_least=False)}, or raise memoryBudget to "
                          f"{shown['minBudget']} yourself")


def _quoted(value) -> str:
    text = str(value)[:40]
    return "".join(c if c.isprintable() else "?" for c in text)


def _size(nbytes: int) -> str:
    return paste_quantity(nbytes)  # a bound to reach: rounded up


def parse_policy(spec: dict | None, budget: int | None = None) -> Rightsizing:
    """The Rightsizing of a schema-valid `spec.rightsizing` mapping (None: Off); `budget`: the model's
    memoryBudget in bytes, which must lie within the limits."""
    if spec is None:
        return OFF
    low = parse_bytes(spec["minBudget"]) if "minBudget" in spec else None
    high = parse_bytes(spec["maxBudget"]) if "maxBudget" in spec else None
    check_limits(low, high, budget, spec)
    return Rightsizing(
        policy=spec.get("policy", DEFAULT_POLICY),
        headroom_percent=float(spec.get("headroomPercent", DEFAULT_HEADROOM_PERCENT)),
        min_budget=low,
        max_budget=high,
        upsize_after_s=parse_duration(spec.get("upsizeAfter", f"{DEFAULT_UPSIZE_AFTER_S}s")),
        downsize_after_s=parse_duration(spec.get("downsizeAfter", f"{DEFAULT_DOWNSIZE_AFTER_S}s")),
        cooldown_s=parse_duration(spec.get("cooldown", f"{DEFAULT_COOLDOWN_S}s")),
    )
