"""The profiler Job: `python -m profiler_job` measures one model on one GPU type and publishes its profile.

Owns the measurement of a model (weights, KV cache, activations, latency,
host-to-device bandwidth) into a document that validates against
schemas/profile.schema.json, and publishing it to a ConfigMap or a file.
Called by the rendered profiler Job (see docs/profiler.md) and by bench/profile_gpu.py.
Heavy imports (torch, transformers) happen inside the modules that need them, so
`profiler_job.publish` and `profiler_job.errors` stay cheap for the controller.
"""

__version__ = "0.1.0"
