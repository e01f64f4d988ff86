"""contract: what the controller, the worker and the profiler Job share, and nothing else.

The bottom layer (docs/architecture.md): Kubernetes quantities (quantity), the GPU
catalog (gpu_catalog), every wire name (wire), the verdicts document (verdicts),
one Kubernetes client setup and ConfigMap write (kube), the footprint arithmetic
behind every memory decision (footprint) and the estimator of profiles from a
published architecture (estimate). It imports only schemas; every program above
imports it, and it imports none of them.
"""
