"""Optional GPU prices: `pricePerGpuHour` in gpus.yaml (product -> price of one GPU-hour).

Read apart from the inventory's slots so a price never changes a plan. A missing or
unreadable gpus.yaml, or no prices, gives {} (costs are then not shown). Called by the
right-sizing step's adapters and PLAN.md's recommendations section.
"""
from __future__ import annotations

import math
from pathlib import Path

import yaml


def read_prices(root: Path) -> dict[str, float]:
    path = Path(root) / "gpus.yaml"
    if path.is_symlink() or not path.is_file():
        return {}
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    prices = doc.get("pricePerGpuHour") if isinstance(doc, dict) else None
    if not isinstance(prices, dict):
        return {}
    return {str(k): float(v) for k, v in prices.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0}
