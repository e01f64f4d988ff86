"""One unreadable model never takes a worker down: a real `python -m worker` process on CPU is given one good
model beside one model per class of unreadable files (a local path missing on the node, the Hub's refusals
from the Hub double, a truncated or corrupt safetensors file, a config.json that is not JSON or not an object,
a directory without a tokenizer). The worker starts, serves the good model over HTTP, and refuses each of the
others alone with its reason, in /status, in the verdicts ConfigMap (kmock over HTTP, through a kubeconfig)
and in the 503 a request for it gets. Each case is its own row, with an id that says which class broke.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from contract import hub as hub_reasons
from contract.wire import VERDICTS_DATA_KEY
from hubdouble import REFUSALS, HubState, serve_hub
from worker_support import (  # noqa: F401  (fixtures are used by name)
    KubeApiThread, WorkerProcess, config_document, model_entry, tiny_models,
)

pytestmark = pytest.mark.slow  # a worker process
GOOD = "good"


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _truncated(source: Path, target: Path) -> Path:
    weights = _copy(source, target) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return target


def _short(source: Path, target: Path) -> Path:
    (_copy(source, target) / "model.safetensors").write_bytes(b"\x01\x02\x03")
    return target


def _header_not_json(source: Path, target: Path) -> Path:
    weights = _copy(source, target) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:24] = b"#not-json-header"
    weights.write_bytes(bytes(data))
    return target


def _config(text: str):
    def make(source: Path, target: Path) -> Path:
        (_copy(source, target) / "config.json").write_text(text)
        return target
    return make


def _no_tokenizer(source: Path, target: Path) -> Path:
    target.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(source / name, target / name)
    return target


# case id -> (how spec.model is made from a good model's directory, or a hub id / path as it is; the reason)
CASES = {
    "local-path-missing-on-the-node": ("/models/not-on-this-node", "ModelUnreadable"),
    "relative-path-missing": ("./models/not-here", "ModelUnreadable"),
    "hub-gated-access-denied": ("org/gated", hub_reasons.ACCESS_DENIED),
    "hub-no-such-model": ("org/absent", hub_reasons.MODEL_NOT_FOUND),
    "hub-no-such-revision": ("org/moved", hub_reasons.REVISION_NOT_FOUND),
    "safetensors-truncated": (_truncated, "ModelUnreadable"),
    "safetensors-shorter-than-its-header": (_short, "ModelUnreadable"),
    "safetensors-header-not-json": (_header_not_json, "ModelUnreadable"),
    "config-not-json": (_config("{not json"), "ModelUnreadable"),
    "config-json-not-an-object": (_config("[1, 2]"), "ModelUnreadable"),
    "config-numbers-of-the-wrong-kind": (_config(json.dumps({"num_hidden_layers": "four"})), "ModelUnreadable"),
    "tokenizer-missing": (_no_tokenizer, "ModelUnreadable"),
}


def _name(case: str) -> str:
    return f"broken-{list(CASES).index(case)}"


@pytest.fixture(scope="module")
def broken_worker(tiny_models, tmp_path_factory):
    """One worker process: the good model first in the config, then every broken case; the verdicts ConfigMap
    in kmock; the Hub double for hub ids. Yields (process, kube)."""
    root = tmp_path_factory.mktemp("unreadable")
    models = [model_entry(GOOD, tiny_models["llama"], "resident")]
    for case, (spec, _) in CASES.items():
        model = spec(tiny_models["llama"], root / case) if callable(spec) else spec
        models.append(model_entry(_name(case), model, "resident"))
    document = config_document(models, verdicts={"namespace": "gpushare", "name": "verdicts"})
    server, endpoint = serve_hub(HubState(refusals=dict(REFUSALS)))
    with KubeApiThread() as kube:
        kubeconfig = root / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "double",
            "clusters": [{"name": "double", "cluster": {"server": str(kube.server.url)}}],
            "users": [{"name": "worker", "user": {"token": "unused"}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "worker"}}]}))
        env = {"KUBECONFIG": str(kubeconfig), "HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0",
               "HF_HUB_CACHE": str(root / "hub-cache"), "HF_TOKEN": "hf_unused"}
        try:
            with WorkerProcess(root, document, env=env, ready=[GOOD]) as process:
                yield process, kube
        finally:
            server.shutdown()
            server.server_close()


def _published(kube) -> dict:
    deadline = time.monotonic() + 30
    while True:
        try:
            document = yaml.safe_load(kube.configmap("gpushare", "verdicts")["data"][VERDICTS_DATA_KEY])
            entries = {m["name"]: m for m in document["models"]}
            if all(entries.get(_name(case), {}).get("verdict") == "refused" for case in CASES):
                return entries
        except KeyError:
            pass
        assert time.monotonic() < deadline, "the verdicts ConfigMap never named every broken model refused"
        time.sleep(0.1)


def test_the_good_model_serves_beside_every_unreadable_one(broken_worker):
    process, _ = broken_worker
    client = openai.OpenAI(base_url=f"{process.base_url}/v1", api_key="unused", max_retries=0)
    answer = client.completions.create(model=GOOD, prompt="hi", max_tokens=2, temperature=0)
    assert answer.usage.completion_tokens == 2
    assert httpx.get(process.base_url + "/readyz", timeout=10).status_code == 200
    assert httpx.get(process.base_url + "/healthz", timeout=10).status_code == 200
    status = httpx.get(process.base_url + "/status", timeout=10).json()
    assert {m["name"]: m["state"] for m in status["models"]}[GOOD] == "serving"


@pytest.mark.parametrize("case", list(CASES))
def test_an_unreadable_model_is_refused_alone_with_its_reason(broken_worker, case):
    process, kube = broken_worker
    name, reason = _name(case), CASES[case][1]
    status = {m["name"]: m for m in httpx.get(process.base_url + "/status", timeout=10).json()["models"]}
    assert (status[name]["state"], status[name]["reason"]) == ("refused", reason), (case, status[name]["message"])
    assert status[name]["message"], case
    published = _published(kube)
    assert (published[name]["verdict"], published[name]["reason"]) == ("refused", reason), case
    assert published[GOOD]["verdict"] == "applied", case
    client = openai.OpenAI(base_url=f"{process.base_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as refusal:
        client.completions.create(model=name, prompt="hi", max_tokens=2)
    assert (refusal.value.status_code, refusal.value.code) == (503, reason), case
    assert process.process.poll() is None, case
