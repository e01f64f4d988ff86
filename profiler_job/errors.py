"""Typed failures of the profiler Job, each with its exit code and one-line termination message.

Owns the reasons the Job can fail for and their exit codes (documented in
docs/profiler.md); a model the Hub refuses fails with contract.hub's reason, as
in the worker. Raised by load, measure and publish; turned into an exit code and
a termination-log line by profiler_job.cli. The controller reads the line
`<Reason>: <message>` into the Degraded condition with the same text (and, for a
Hub refusal, the same reason).
"""
from __future__ import annotations

from contract import hub


class ProfilerError(Exception):
    """A failure with a PascalCase `reason`, a distinct exit code and a message saying what, why and the fix."""

    reason = "ProfilerError"
    exit_code = 1

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def line(self) -> str:
        return f"{self.reason}: {self.message}"


class InvalidArguments(ProfilerError):
    reason, exit_code = "InvalidArguments", 2


class ModelNotFound(ProfilerError):
    reason, exit_code = "ModelNotFound", 3


class HubAccessDenied(ProfilerError):
    reason, exit_code = hub.ACCESS_DENIED, 4


class UnsupportedArchitecture(ProfilerError):
    reason, exit_code = "UnsupportedArchitecture", 5


class OutOfMemory(ProfilerError):
    reason, exit_code = "OutOfMemory", 6


class NoGPU(ProfilerError):
    reason, exit_code = "NoGPU", 7


class ConfigMapForbidden(ProfilerError):
    reason, exit_code = "ConfigMapForbidden", 8


class KVCacheMismatch(ProfilerError):
    reason, exit_code = "KVCacheMismatch", 9


class PublishFailed(ProfilerError):
    reason, exit_code = "PublishFailed", 10


class InvalidProfile(ProfilerError):
    reason, exit_code = "InvalidProfile", 11


class HubModelNotFound(ProfilerError):
    reason, exit_code = hub.MODEL_NOT_FOUND, 12


class HubRevisionNotFound(ProfilerError):
    reason, exit_code = hub.REVISION_NOT_FOUND, 13


class ModelNotCached(ProfilerError):
    reason, exit_code = hub.NOT_CACHED, 14


class HubUnreachable(ProfilerError):
    reason, exit_code = hub.UNREACHABLE, 15


class HubDownloadFailed(ProfilerError):
    reason, exit_code = hub.DOWNLOAD_FAILED, 16


class UnsupportedWeightDtype(ProfilerError):
    """--weights names a dtype this GPU cannot run (contract.precision: bfloat16 and int4 need 8.0 or later)."""

    reason, exit_code = "UnsupportedWeightDtype", 17


class UnsupportedQuantization(ProfilerError):
    """The checkpoint is already quantized in a library's own layout (its config.json quantization_config)."""

    reason, exit_code = "UnsupportedQuantization", 18


# Every reason, in exit-code order: the table docs/profiler.md documents and the tests walk.
ALL_ERRORS: tuple[type[ProfilerError], ...] = (
    InvalidArguments, ModelNotFound, HubAccessDenied, UnsupportedArchitecture, OutOfMemory,
    NoGPU, ConfigMapForbidden, KVCacheMismatch, PublishFailed, InvalidProfile,
    HubModelNotFound, HubRevisionNotFound, ModelNotCached, HubUnreachable, HubDownloadFailed,
    UnsupportedWeightDtype, UnsupportedQuantization,
)
# contract.hub's refusals, by reason: the worker and the profiler fail a model the Hub refuses for the same reason.
HUB_ERRORS: dict[str, type[ProfilerError]] = {
    e.reason: e for e in (HubAccessDenied, HubModelNotFound, HubRevisionNotFound, ModelNotCached, HubUnreachable,
                          HubDownloadFailed)}
INTERNAL_ERROR_EXIT_CODE = 1
