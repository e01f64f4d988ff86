"""The worker: one process per GPU slot that admits, loads and serves the models placed there.

`python -m worker --config worker.yaml` (see docs/worker.md). Modules: config (the
schema-checked config), shape + admission (bytes before loading), policy + scheduler
(queues, swaps, the executor thread over the engine package's batch, engine/), runtime
(the Worker), protocol + api (OpenAI-compatible HTTP), grammar + tools
(response_format and tool calls held to their schema by token masks), metrics, verdicts
(publication to a ConfigMap).
"""
