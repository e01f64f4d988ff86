"""Trust, but check, a profile: its weight and KV-cache bytes against the model's architecture.

Owns `profile_problem`: when the architecture of a profile's model is known (the published
config.json facts in contract.estimate, else the `architecture` block the profile carries,
which the profiler and the estimator copy from the model's config.json), the exact parameter
count gives the weight bytes for the profile's dtype (its decoder linears in weights.dtype when that
is int8 or int4, contract.footprint) and the KV-cache bytes per token; a
profile that claims more than `TOLERANCE` away from either is refused (a 70B model claiming
zero-byte weights would otherwise be planned resident beside everything else). Profiles with
neither are taken as written. Pure; called by controller.inputs.load.parse_profile.
"""
from __future__ import annotations

from collections.abc import Mapping

from contract.estimate import (DTYPE_BYTES, PUBLISHED_CONFIGS, architecture_from_config,
                               architecture_kv_bytes_per_token, layer_bytes, parameter_counts)
from contract.quantity import format_bytes
from controller.types import InputError, Profile

TOLERANCE = 0.25  # a measured profile may differ from the exact arithmetic by this share (allocator padding, buffers)


def expected_bytes(model: str, dtype: str, architecture: Mapping | None = None,
                   stored: str | None = None) -> tuple[int, int, str] | None:
    """(weight bytes, KV-cache bytes per token, where the architecture came from) of `model` in `dtype` with
    its decoder linears stored as `stored` (int8, int4; None: `dtype`): from its published config when gpushare
    knows it, else from the `architecture` block the profile carries (the facts of the config.json it was
    measured or estimated from); None when neither is usable."""
    if dtype not in DTYPE_BYTES:
        return None
    config = PUBLISHED_CONFIGS.get(model)
    where = "its published architecture" if config is not None else "the architecture block of the profile"
    try:
        block = architecture_from_config(config) if config is not None else dict(architecture or {})
        if not block:
            return None
        counts = parameter_counts(block)
        weights = ((counts.embedding + counts.final_norm + counts.head) * DTYPE_BYTES[dtype]
                   + layer_bytes(counts, dtype, stored or dtype) * counts.layers)
        return weights, architecture_kv_bytes_per_token(block, dtype), where
    except (KeyError, TypeError, ValueError, ZeroDivisionError):  # a block the arithmetic cannot count
        return None


def profile_problem(profile: Profile, tolerance: float = TOLERANCE, architecture: Mapping | None = None
                    ) -> InputError | None:
    """An InputError when `profile` disagrees with its model's known architecture beyond `tolerance`."""
    expected = expected_bytes(profile.model, profile.dtype, architecture, profile.stored_dtype)
    if expected is None:
        return None
    checks = (("weights.totalBytes", profile.weight_bytes, expected[0], format_bytes),
              ("kvCache.bytesPerToken", profile.kv_bytes_per_token, expected[1], lambda n: f"{n} bytes"))
    for path, claimed, exact, show in checks:
        if abs(claimed - exact) > tolerance * exact:
            return InputError(
                str(profile.file), None, path, reason="ProfileDisagreesWithArchitecture",
                message=(f"{path} is {show(claimed)} for {profile.model} in {profile.stored_dtype}, but {expected[2]} "
                         f"gives {show(exact)} (more than {tolerance:.0%} apart); the profile is not used"),
                fix="re-run the profiler Job for this model, or regenerate the estimate with "
                    "`python -m contract.estimate`")
    return None
