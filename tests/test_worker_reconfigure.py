"""In-place reconfiguration: the diff a changed config asks for, and applying it to a running worker
while an untouched co-tenant serves a bounded load: no request of it fails, its engine is the
same object; a removed model drains and frees, a re-laid-out one reloads with its new shape, an
added one loads, a budget change is retuned without a reload, and a model that no longer fits is
refused alone with numbers."""
from __future__ import annotations

import threading

import pytest
import yaml

from worker.config import parse_config
from worker.errors import ModelNotFound
from worker.reconfigure import diff
from worker.scheduler import ErrorEvent, FinishEvent
from worker.watch import ConfigWatch
from worker_support import (  # noqa: F401  (fixtures are used by name)
    MiB, Collector, config_document, generation, model_entry, started_worker, single_threaded_torch, tiny_models,
)

WAIT_S = 60


def config(*entries, **kwargs):
    return parse_config(config_document(list(entries), **kwargs))


@pytest.mark.parametrize("case,before,after,expect", [
    ("same-entry-unchanged", dict(), dict(), "unchanged"),
    ("budget-only-retuned", dict(), dict(budget=400 * MiB), "retuned"),
    ("slo-only-retuned", dict(), dict(slo={"tpotMs": 20}), "retuned"),
    ("concurrency-relaid", dict(), dict(concurrency=3), "relaid"),
    ("context-relaid", dict(), dict(context=128), "relaid"),
    ("mode-relaid", dict(), dict(mode="swap"), "relaid"),
    ("resident-layers-relaid", dict(mode="elastic", residentLayers=1), dict(mode="elastic", residentLayers=2),
     "relaid"),
])
def test_diff_sorts_each_model_by_what_changed(case, before, after, expect):
    def entry(**kw):
        mode = kw.pop("mode", "resident")
        return model_entry("m", "/models/m", mode, **kw)

    change = diff(config(entry(**before)), config(entry(**after)))
    got = {"unchanged": change.unchanged, "retuned": change.retuned, "relaid": change.relaid}
    assert [k for k, v in got.items() if v] == [expect], case
    assert not change.added and not change.removed and change.restart_needed is None, case


def test_diff_names_added_and_removed_models_and_refuses_a_slot_change():
    old = config(model_entry("a", "/m/a", "resident"), model_entry("b", "/m/b", "swap"))
    new = config(model_entry("a", "/m/a", "resident"), model_entry("c", "/m/c", "swap"))
    change = diff(old, new)
    assert change.removed == ("b",) and [m.name for m in change.added] == ["c"] and change.unchanged == ("a",)
    moved = parse_config({**config_document([model_entry("a", "/m/a", "resident")]),
                          "slot": {"id": "node-b/gpu1", "product": "NVIDIA-H200", "capacityBytes": 512 * MiB}})
    assert "restart" in diff(old, moved).restart_needed


def test_a_changed_config_applies_in_place_while_an_untouched_model_keeps_serving(tiny_models, tmp_path):
    path = tmp_path / "worker.yaml"
    before = [model_entry("steady", tiny_models["llama"], "resident"),
              model_entry("leaving", tiny_models["qwen2"], "swap"),
              model_entry("reshaped", tiny_models["gpt2"], "resident", concurrency=1),
              model_entry("retuned", tiny_models["llama-b"], "resident")]
    path.write_text(yaml.safe_dump(config_document(before)))
    worker = started_worker(config_document(before))
    watch = ConfigWatch(path, worker)
    steady_engine, retuned_engine = worker.served["steady"].engine, worker.served["retuned"].engine
    outcomes, stop = [], threading.Event()

    def load():  # a bounded stream of requests to the model that does not change
        for _ in range(200):
            if stop.is_set():
                return
            sink = Collector()
            worker.submit("steady", generation(tokens=3), sink)
            assert sink.done.wait(WAIT_S)
            outcomes.append(sink.events[-1])

    traffic = threading.Thread(target=load)
    traffic.start()
    try:
        after = [before[0],
                 model_entry("reshaped", tiny_models["gpt2"], "resident", concurrency=2),
                 model_entry("retuned", tiny_models["llama-b"], "resident", budget=330 * MiB, slo={"tpotMs": 50}),
                 model_entry("added", tiny_models["qwen2"], "elastic", residentLayers=1),
                 model_entry("too-big", tiny_models["llama"], "resident", budget=1 << 30, context=1_000_000)]
        path.write_text(yaml.safe_dump(config_document(after)))
        change = watch.check()
        assert watch.check() is None, "an unchanged file is not applied twice"
    finally:
        stop.set()
        traffic.join(WAIT_S)
    try:
        assert change.summary() == "1 unchanged, 1 retuned, 1 re-laid-out, 2 added, 1 removed"
        assert outcomes and all(isinstance(e, FinishEvent) for e in outcomes), "a request to the untouched model failed"
        assert worker.served["steady"].engine is steady_engine, "the untouched model was reloaded"
        assert worker.served["retuned"].engine is retuned_engine, "a budget change reloaded the model"
        assert worker.ledgers["retuned"].budget_bytes == 330 * MiB
        assert worker.scheduler.executors["retuned"].priority, "a latency SLO gives the model's stream priority"
        assert not worker.scheduler.executors["steady"].priority
        with pytest.raises(ModelNotFound):
            worker.lookup("leaving")
        assert "leaving" not in worker.ledgers and "leaving" not in worker.scheduler.executors
        assert worker.served["reshaped"].engine.concurrency == 2
        too_big = worker.verdicts["too-big"]
        assert too_big.verdict == "refused" and too_big.missing_bytes > 0
        for name in ("reshaped", "added", "retuned", "steady"):
            sink = Collector()
            worker.submit(name, generation(tokens=2), sink)
            assert sink.done.wait(WAIT_S) and isinstance(sink.events[-1], FinishEvent), name
        assert not any(isinstance(e, ErrorEvent) for e in outcomes)
    finally:
        worker.stop()


def test_a_change_that_does_not_validate_is_skipped_and_the_worker_keeps_its_config(tiny_models, tmp_path):
    path = tmp_path / "worker.yaml"
    document = config_document([model_entry("m", tiny_models["llama"], "resident")])
    path.write_text(yaml.safe_dump(document))
    worker = started_worker(document)
    try:
        watch = ConfigWatch(path, worker)
        path.write_text("models: [nope")
        assert watch.check() is None
        assert worker.model_state("m") == "serving"
    finally:
        worker.stop()


def test_a_re_laid_out_model_whose_new_files_are_unreadable_keeps_serving_its_previous_configuration(tiny_models):
    before = [model_entry("m", tiny_models["llama"], "resident")]
    worker = started_worker(config_document(before))
    try:
        engine = worker.served["m"].engine
        worker.apply(config(model_entry("m", "/models/not-on-this-node", "resident")))
        verdict = worker.verdicts["m"]
        assert (verdict.verdict, worker.model_state("m")) == ("applied", "serving")
        assert "ModelUnreadable" in verdict.message and "previous configuration" in verdict.message
        assert worker.served["m"].engine is engine and worker.config.model("m").model == str(tiny_models["llama"])
        sink = Collector()
        worker.submit("m", generation(tokens=2), sink)
        assert sink.done.wait(WAIT_S) and isinstance(sink.events[-1], FinishEvent)
    finally:
        worker.stop()
