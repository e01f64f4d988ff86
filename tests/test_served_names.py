"""spec.servedNames: aliases a worker also serves a model under. Parsed and kept in the last good spec, refused
when they collide on one worker (the later model gets ServedNameTaken naming the field), carried into worker.yaml,
and resolved by the worker to the model they name."""
from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from controller.rendering.compose import compose
from controller.rendering.compose_errors import ServedNameTaken
from controller.inputs.load import parse_model
from controller.serialize import model_to_doc
from controller.types import Source
from tests.compose_scenario import CHAT, CODER, MODELS, PLAN, SLOTS, SUMMARIZER
from worker.config import parse_config
from worker.errors import ConfigError
from worker_support import (  # noqa: F401  (fixtures are used by name)
    config_document, model_entry, single_threaded_torch, tiny_models,
)


def doc(**spec) -> dict:
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
            "metadata": {"name": "chat", "namespace": "llm"},
            "spec": {"model": "org/m", "memoryBudget": "4Gi", **spec}}


def test_served_names_parse_and_survive_as_the_last_good_spec():
    model, errors = parse_model(doc(servedNames=["gpt-4o-mini", "chat/latest"]), Source("models/chat.yaml"))
    assert errors == [] and model.served_names == ("gpt-4o-mini", "chat/latest")
    again, _ = parse_model(model_to_doc(model), Source("decisions/llm/chat.yaml"))
    assert again.served_names == model.served_names


@pytest.mark.parametrize("names, path", [
    pytest.param(["a", "a"], "spec.servedNames", id="repeated-alias"),
    pytest.param(["-leading-dash"], "spec.servedNames[0]", id="alias-not-a-name"),
    pytest.param([f"n{i}" for i in range(9)], "spec.servedNames", id="too-many-aliases"),
])
def test_bad_served_names_are_input_errors(names, path):
    model, errors = parse_model(doc(servedNames=names), Source("models/chat.yaml"))
    assert model is None and [(e.path, e.reason) for e in errors] == [(path, "InvalidSpec")]


def models_with(**aliases) -> list:
    by_name = {m.name: m for m in MODELS}
    return [replace(m, served_names=aliases.get(m.name.replace("-", "_"), ())) for m in by_name.values()]


@pytest.mark.parametrize("aliases, later, field", [
    pytest.param({"chat_small": ("gpt-4o-mini",), "coder": ("gpt-4o-mini",)}, "llm/coder", "spec.servedNames",
                 id="alias-taken-by-an-alias"),
    pytest.param({"coder": ("summarizer",)}, "llm/summarizer", "metadata.name", id="name-taken-by-an-alias"),
])
def test_a_name_served_twice_on_one_worker_refuses_the_later_model(aliases, later, field):
    result = compose(models_with(**aliases), PLAN, SLOTS)
    (error,) = result.errors
    assert (type(error), error.ref) == (ServedNameTaken, later)
    assert field in error.message and field in error.fix


def test_aliases_reach_worker_yaml_and_the_worker_resolves_them():
    files = compose(models_with(chat_small=("gpt-4o-mini",)), PLAN, SLOTS).files
    config = yaml.safe_load(yaml.safe_load(files["rendered/gpushare-system/configmap-worker-node-a-gpu0-default.yaml"])
                            ["data"]["worker.yaml"])
    (entry,) = [m for m in config["models"] if m["name"] == CHAT.name]
    assert entry["servedNames"] == ["gpt-4o-mini"]
    assert "servedNames" not in next(m for m in config["models"] if m["name"] == CODER.name)
    worker = parse_config(config)
    assert worker.model("gpt-4o-mini").name == CHAT.name and worker.model(SUMMARIZER.name).name == SUMMARIZER.name
    assert worker.model("gpt-4o") is None


def test_a_worker_config_serving_one_name_twice_is_refused():
    models = [model_entry("a", "/m", "resident", servedNames=["shared"]), model_entry("shared", "/m", "resident")]
    with pytest.raises(ConfigError) as refused:
        parse_config(config_document(models))
    assert refused.value.reason == "DuplicateModelName" and "shared" in refused.value.message


def test_the_running_worker_serves_a_model_under_its_alias(tiny_models):
    from worker_support import started_worker
    worker = started_worker(config_document([model_entry("chat", tiny_models["gpt2"], "resident",
                                                         servedNames=["gpt-4o-mini"])]))
    try:
        assert worker.lookup("gpt-4o-mini") is worker.lookup("chat")
    finally:
        worker.stop()
