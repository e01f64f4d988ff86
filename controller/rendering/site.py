"""Install-time composition parameters: the values one install sets for every composition.

Owns applying the controller's configuration (`--worker-image`, which the install manifest
fills from its WORKER_IMAGE) to compositions: a value set here replaces the schema default of
every composition whose own file leaves that parameter unset; a composition that sets it keeps
its own. So the worker and profiler image changes with one install setting, never a rebuild.
Each value is checked against schemas/composition.schema.json. Pure; called by the
`gpushare reconcile` shell (controller.reconcile_cli, controller.cluster_loop).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import jsonschema

import schemas
from controller.inputs.compositions import Composition


class InstallParameterInvalid(Exception):
    """An install-time parameter value the composition schema refuses."""

    reason = "InstallParameterInvalid"

    def __init__(self, name: str, detail: str):
        super().__init__(f"install parameter {name}: {detail}; see schemas/composition.schema.json "
                         f"($defs.parameters.properties.{name}) for what it accepts")
        self.message = str(self)


def install_parameters(*, worker_image: str | None = None) -> dict[str, object]:
    """The parameters the controller's flags set (unset flags set nothing)."""
    return {} if worker_image is None else {"image": worker_image}


def with_install_parameters(compositions: Mapping[str, Composition],
                            values: Mapping[str, object]) -> dict[str, Composition]:
    """`compositions` with `values` in place of the defaults their files did not override."""
    definitions = schemas.load("composition")
    declared = definitions["$defs"]["parameters"]["properties"]
    for name, value in values.items():
        if name not in declared:
            raise InstallParameterInvalid(name, f"no composition parameter is named {name!r}")
        schema = {"$defs": definitions["$defs"], **declared[name]}
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
        if error is not None:
            raise InstallParameterInvalid(name, f"{value!r}: {error.message}")
    return {
        key: dataclasses.replace(composition, parameters=MappingProxyType(
            {**composition.parameters, **{k: v for k, v in values.items() if k not in composition.explicit}}))
        for key, composition in compositions.items()
    }
