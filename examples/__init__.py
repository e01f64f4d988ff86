"""Example GitOps trees, shipped in the package as `gpushare_examples` so `gpushare demo` works from a
wheel or an image: `fleet/` (models/, gpus.yaml, profiles/). Read by controller.reconcile_cli."""
from pathlib import Path

FLEET = Path(__file__).resolve().parent / "fleet"
