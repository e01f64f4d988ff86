"""Trust, but check, a profile: its weight and KV-cache bytes against the model's architecture.

Owns `profile_problem`: when the architecture of a profile's model is known (the published
config.json facts in controller.estimate), the exact parameter count gives the weight bytes
for the profile's dtype and the KV-cache bytes per token; a profile that claims more than
`TOLERANCE` away from either is refused (a 70B model claiming zero-byte weights would
otherwise be planned resident beside everything else). Profiles of models whose
architecture is unknown are taken as written. Pure; called by controller.repo.
"""
from __future__ import annotations

from contract.estimate import (DTYPE_BYTES, PUBLISHED_CONFIGS, _kv_cache, architecture_from_config,
                                 parameter_counts)
from contract.quantity import format_bytes
from controller.types import InputError, Profile

TOLERANCE = 0.25  # a measured profile may differ from the exact arithmetic by this share (allocator padding, buffers)


def expected_bytes(model: str, dtype: str) -> tuple[int, int] | None:
    """(weight bytes, KV-cache bytes per token) of `model` in `dtype`, or None when its architecture is unknown."""
    config = PUBLISHED_CONFIGS.get(model)
    if config is None or dtype not in DTYPE_BYTES:
        return None
    architecture = architecture_from_config(config)
    weights = parameter_counts(architecture).total * DTYPE_BYTES[dtype]
    return weights, _kv_cache(architecture, dtype)["bytesPerToken"][0]


def profile_problem(profile: Profile, tolerance: float = TOLERANCE) -> InputError | None:
    """An InputError when `profile` disagrees with its model's known architecture beyond `tolerance`."""
    expected = expected_bytes(profile.model, profile.dtype)
    if expected is None:
        return None
    checks = (("weights.totalBytes", profile.weight_bytes, expected[0], format_bytes),
              ("kvCache.bytesPerToken", profile.kv_bytes_per_token, expected[1], lambda n: f"{n} bytes"))
    for path, claimed, exact, show in checks:
        if abs(claimed - exact) > tolerance * exact:
            return InputError(
                str(profile.file), None, path, reason="ProfileDisagreesWithArchitecture",
                message=(f"{path} is {show(claimed)} for {profile.model} in {profile.dtype}, but its published "
                         f"architecture gives {show(exact)} (more than {tolerance:.0%} apart); the profile is "
                         "not used"),
                fix="re-run the profiler Job for this model, or regenerate the estimate with "
                    "`python -m controller.estimate`")
    return None
