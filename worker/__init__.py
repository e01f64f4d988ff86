"""The worker: one process per GPU slot that admits, loads and serves the models placed there.

`python -m worker --config worker.yaml` (see docs/worker.md). Modules: config (the
schema-checked config), shape + admission (bytes before loading), memory (probe and
per-model ledger), residency/ (resident, swap, elastic), transfer (side-stream copies),
engine (one request's generation), policy + scheduler (queues, swaps, the executor
thread), runtime (the Worker), protocol + api (OpenAI-compatible HTTP), grammar + tools
(response_format and tool calls held to their schema by token masks), metrics, verdicts
(publication to a ConfigMap).
"""
