"""Install-time composition parameters: the values one install sets for every composition.

Owns applying the controller's configuration (`--worker-image`, which the install manifest
fills from its WORKER_IMAGE, and the cache root GPUSHARE_HOST_PATH_ROOT) to compositions: a value set here replaces the schema default of
every composition whose own file leaves that parameter unset; a composition that sets it keeps
its own. So the worker and profiler image changes with one install setting, never a rebuild.
Each value is checked against schemas/composition.schema.json and the Kubernetes rule of the
field it fills (controller.inputs.compositions.parameter_problems). Pure; called by the
`gpushare reconcile` shell (controller.reconcile_cli, controller.cluster_loop).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import jsonschema

import schemas
from controller.inputs.cache_policy import DEFAULT_HOST_PATH_ROOT
from controller.inputs.compositions import Composition, parameter_problems


class InstallParameterInvalid(Exception):
    """An install-time parameter value the composition schema refuses."""

    reason = "InstallParameterInvalid"

    def __init__(self, name: str, detail: str):
        super().__init__(f"install parameter {name}: {detail}; see schemas/composition.schema.json "
                         f"($defs.parameters.properties.{name}) for what it accepts")
        self.message = str(self)


def install_parameters(*, worker_image: str | None = None, host_path_root: str = DEFAULT_HOST_PATH_ROOT
                       ) -> dict[str, object]:
    """The parameters the controller's settings set (unset ones set nothing): the image, and with a cache root
    other than the default, the default model cache moved under it (`<root>/models`), so the shipped
    compositions stay inside the root the install allows."""
    values: dict[str, object] = {} if worker_image is None else {"image": worker_image}
    if host_path_root != DEFAULT_HOST_PATH_ROOT:
        values["modelCache"] = {"hostPath": f"{host_path_root}/models"}
    return values


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
        problems = parameter_problems({name: value})
        if problems:
            raise InstallParameterInvalid(name, f"{value!r}: {problems[0].message} [{problems[0].reason}]")
    return {
        key: dataclasses.replace(composition, parameters=MappingProxyType(
            {**composition.parameters, **{k: v for k, v in values.items() if k not in composition.explicit}}))
        for key, composition in compositions.items()
    }
