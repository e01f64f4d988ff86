"""Typed errors of composing one ElasticModel; each blocks that model only.

Owns the error types in Rendered.errors. Every error carries a PascalCase
`reason`, the ElasticModel it belongs to (`ref`, namespace/name), what failed and
the fix. Raised inside controller.rendering.compose and collected per model; the reconcile
loop turns them into conditions.
"""
from __future__ import annotations


class ComposeError(Exception):
    reason = "ComposeFailed"

    def __init__(self, ref: str, message: str, fix: str):
        super().__init__(f"{ref}: {message}; fix: {fix}")
        self.ref = ref
        self.message = message
        self.fix = fix

    def __reduce__(self):  # crosses process boundaries intact (compose renders large passes in parallel)
        return (type(self), (self.ref, self.message, self.fix))

    def for_ref(self, ref: str) -> ComposeError:
        """The same failure reported against another model that shares the failed object."""
        return type(self)(ref, self.message, self.fix)


class UnknownComposition(ComposeError):
    reason = "UnknownComposition"


class InvalidName(ComposeError):
    """A name or namespace that is not a DNS-1123 label cannot name objects or files."""

    reason = "InvalidName"


class UnknownSlot(ComposeError):
    reason = "UnknownSlot"


class ServedNameTaken(ComposeError):
    """Two ElasticModels of one name (in different namespaces) landed in one worker, which serves by name."""

    reason = "ServedNameTaken"


class MixedCompositions(ComposeError):
    """A GPU slot's models must share one composition: each composition's worker claims the GPU."""

    reason = "MixedCompositions"


class PoolWorkerWithoutGpu(ComposeError):
    """A worker on a pool node's GPU whose Deployment requests no nvidia.com/gpu: no autoscaler would add the
    node for it."""

    reason = "PoolWorkerWithoutGpu"


class RenderFailed(ComposeError):
    reason = "RenderFailed"


class ManifestInvalid(ComposeError):
    reason = "ManifestInvalid"


class OutputConflict(ComposeError):
    """Two different objects would be written to the same file."""

    reason = "OutputConflict"


class HostPathOutsideRoot(ComposeError):
    """The composition mounts a node directory outside the install's cache root (controller.inputs.cache_policy)."""

    reason = "HostPathOutsideRoot"


class NameCollision(ComposeError):
    """Two sources whose names are equal once sanitised into one Kubernetes name: the second is refused."""

    reason = "NameCollision"


class InvalidLabel(ComposeError):
    """A label key or value (metadata, a selector, a nodeSelector) the API server refuses."""

    reason = "InvalidLabel"


class InvalidAnnotation(ComposeError):
    reason = "InvalidAnnotation"


class InvalidQuantity(ComposeError):
    """A resource request or limit that is not a non-negative Kubernetes quantity."""

    reason = "InvalidQuantity"


class InvalidToleration(ComposeError):
    reason = "InvalidToleration"


# The error of each kube_rules reason.
RULE_ERRORS: dict[str, type[ComposeError]] = {cls.reason: cls for cls in (
    InvalidName, InvalidLabel, InvalidAnnotation, InvalidQuantity, InvalidToleration)}
