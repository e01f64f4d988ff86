"""The bounds on one user YAML document: nodes once aliases are expanded, alias references, nesting depth.

Owns `YamlLimits` and its environment settings (docs/limits.md). A module of its own below both readers that
take it, so neither imports the other for it: controller.inputs.canonical (the canonical path stops near
them) and controller.inputs.yamlin (the event and node paths check them); controller.inputs.reader builds
them from the environment.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class YamlLimits:
    """Bounds on one user document (see docs/limits.md); each has an environment setting."""

    max_nodes: int = 200_000  # nodes once every alias is expanded
    max_aliases: int = 10_000  # alias references (`*name`)
    max_depth: int = 64  # nesting of mappings and sequences

    @classmethod
    def from_env(cls, environ=os.environ) -> YamlLimits:
        """GPUSHARE_YAML_MAX_NODES, GPUSHARE_YAML_MAX_ALIASES, GPUSHARE_YAML_MAX_DEPTH override the defaults."""
        def setting(name: str, default: int) -> int:
            text = environ.get(name, "").strip()
            return int(text) if text.isdigit() and int(text) > 0 else default

        return cls(setting("GPUSHARE_YAML_MAX_NODES", cls.max_nodes),
                   setting("GPUSHARE_YAML_MAX_ALIASES", cls.max_aliases),
                   setting("GPUSHARE_YAML_MAX_DEPTH", cls.max_depth))

    def scaled(self, factor: int) -> YamlLimits:
        """These limits with `factor` times the nodes: for a file the controller wrote, which grows with the fleet."""
        return YamlLimits(self.max_nodes * factor, self.max_aliases, self.max_depth)
