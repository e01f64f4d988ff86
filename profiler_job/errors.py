"""Typed failures of the profiler Job, each with its exit code and one-line termination message.

Owns the reasons the Job can fail for and their exit codes (documented in
docs/profiler.md). Raised by load, measure and publish; turned into an exit code
and a termination-log line by profiler_job.cli. The controller reads the line
`<Reason>: <message>` into a Degraded/ProfileFailed condition with the same text.
"""
from __future__ import annotations


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


class GatedOrUnauthorized(ProfilerError):
    reason, exit_code = "GatedOrUnauthorized", 4


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


# Every reason, in exit-code order: the table docs/profiler.md documents and the tests walk.
ALL_ERRORS: tuple[type[ProfilerError], ...] = (
    InvalidArguments, ModelNotFound, GatedOrUnauthorized, UnsupportedArchitecture, OutOfMemory,
    NoGPU, ConfigMapForbidden, KVCacheMismatch, PublishFailed, InvalidProfile,
)
INTERNAL_ERROR_EXIT_CODE = 1
