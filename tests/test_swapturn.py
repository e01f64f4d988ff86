"""The minimum swap residency is one fact: the worker's default, the schema's default and the planner's bound."""
import schemas
from contract.swapturn import MIN_RESIDENCY_MS
from controller.planning import cost
from worker.config import WorkerConfig


def test_worker_schema_and_planner_share_the_minimum_residency():
    schema = schemas.load("worker-config")
    assert schema["properties"]["server"]["properties"]["minResidencyMs"]["default"] == MIN_RESIDENCY_MS
    assert WorkerConfig(slot_id="s", product="p", capacity_bytes=1).min_residency_ms == MIN_RESIDENCY_MS
    assert cost.MIN_RESIDENCY_MS == MIN_RESIDENCY_MS
