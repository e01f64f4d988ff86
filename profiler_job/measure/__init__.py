"""The measurements of one model: weights, KV cache, activations, latency, host-to-device bandwidth.

Each module returns a small frozen result with its numbers, whether they were
measured on the device the profile is for, and a `derivation` text per field.
profiler_job.run calls them stage by stage; profiler_job.profile assembles them.
"""
