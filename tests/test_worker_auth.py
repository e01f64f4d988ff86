"""Tenants apart at the worker (`--authorization kubernetes`, the compositions' default): each request is authorised
for the model's namespace, with a ServiceAccount token (TokenReview, then a SubjectAccessReview of `get` on the
ElasticModel) or the API key of that namespace's Secret. One worker serves two tenants' models; the API server
double answers the reviews and holds the Secrets; the official openai client calls the app `python -m worker`
really builds. Nothing of the other tenant is reachable, listed, or shown by /status, /readyz or /metrics."""
from __future__ import annotations

import base64

import httpx
import kmock
import openai
import pytest
import yaml

import worker.__main__ as worker_main
from tests.kubedouble import serve as serve_double
from worker.auth import Authorizer
from worker_support import (  # noqa: F401  (fixtures are used by name)
    ServerThread, config_document, model_entry, single_threaded_torch, tiny_models,
)

KEYS = {"team-a": "sk-team-a-7f3a9c", "team-b": "sk-team-b-41d0e2"}
TOKENS = {"token-a": "system:serviceaccount:team-a:client", "token-b": "system:serviceaccount:team-b:client",
          "token-nobody": "system:serviceaccount:other:client"}
MODELS = {"alpha": "team-a", "beta": "team-b"}


def _token_review(request: kmock.Request) -> dict:
    user = TOKENS.get(request.data["spec"]["token"])
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": request.data["spec"], "status": {
        "authenticated": user is not None, **({"user": {"username": user, "groups": ["system:serviceaccounts"]}}
                                              if user else {})}}


def _access_review(request: kmock.Request) -> dict:
    spec = request.data["spec"]
    attributes = spec["resourceAttributes"]
    expected = {"group": "gpushare.dev", "resource": "elasticmodels", "verb": "get"}
    allowed = ({k: attributes.get(k) for k in expected} == expected
               and spec["user"].startswith(f"system:serviceaccount:{attributes['namespace']}:"))
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec,
            "status": {"allowed": allowed}}


@pytest.fixture(scope="module")
def double():
    with serve_double() as running:
        running.mock[kmock.method.POST, kmock.resource("authentication.k8s.io", "v1", "tokenreviews")] \
            << 201 << _token_review
        running.mock[kmock.method.POST, kmock.resource("authorization.k8s.io", "v1", "subjectaccessreviews")] \
            << 201 << _access_review
        for namespace, key in KEYS.items():
            running.seed("secrets", {"apiVersion": "v1", "kind": "Secret",
                                     "metadata": {"name": "llm-api", "namespace": namespace},
                                     "data": {"key": base64.b64encode(key.encode()).decode()}})
        yield running


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory, double):
    config = tmp_path_factory.mktemp("auth") / "worker.yaml"
    config.write_text(yaml.safe_dump(config_document([
        model_entry(name, tiny_models["gpt2"], "resident", namespace=namespace) for name, namespace in MODELS.items()])))
    captured = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("contract.kube.api_client", lambda *a, **k: double.api_client)
        patch.setattr("worker.serve.serve", lambda worker, app, **kwargs: captured.setdefault("app", app))
        patch.setattr("worker.runtime.Worker.stop", lambda self, **kwargs: captured.setdefault("worker", self))
        assert worker_main.main(["--config", str(config), "--log-level", "warning", "--authorization", "kubernetes",
                                 "--api-key-secret", "llm-api/key"]) == 0
    captured["worker"].wait_loaded(60)
    with ServerThread(captured["app"]) as thread:
        yield thread.base_url
    type(captured["worker"]).stop(captured["worker"])


def client(base: str, credential: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=credential, max_retries=0)


CALLERS = [pytest.param(KEYS["team-a"], {"alpha"}, id="team-a-key"),
           pytest.param(KEYS["team-b"], {"beta"}, id="team-b-key"),
           pytest.param("token-a", {"alpha"}, id="team-a-serviceaccount"),
           pytest.param("token-b", {"beta"}, id="team-b-serviceaccount"),
           pytest.param("token-nobody", set(), id="serviceaccount-without-rbac"),
           pytest.param("sk-forged", set(), id="unknown-credential")]


@pytest.mark.parametrize("credential, reachable", CALLERS)
def test_each_caller_lists_and_reaches_only_its_namespaces_models(served, credential, reachable):
    api = client(served, credential)
    assert {m.id for m in api.models.list()} == reachable
    for name in MODELS:
        if name in reachable:
            done = api.completions.create(model=name, prompt="hi", max_tokens=2, temperature=0)
            assert done.usage.completion_tokens == 2
            assert api.models.retrieve(name).id == name
            continue
        for call in (lambda: api.completions.create(model=name, prompt="hi", max_tokens=1),
                     lambda: api.chat.completions.create(model=name, messages=[{"role": "user", "content": "x"}]),
                     lambda: api.models.retrieve(name)):
            with pytest.raises(openai.NotFoundError) as hidden:  # answered exactly as an unknown model
                call()
            assert hidden.value.body["code"] == "ModelNotFound"
            assert MODELS[name] not in str(hidden.value.body)


@pytest.mark.parametrize("credential, reachable", CALLERS)
def test_status_and_readiness_show_only_the_callers_models(served, credential, reachable):
    headers = {"Authorization": f"Bearer {credential}"}
    status = httpx.get(f"{served}/status", headers=headers, timeout=10).json()
    assert {m["name"] for m in status["models"]} == reachable
    ready = httpx.get(f"{served}/readyz", headers=headers, timeout=10)
    assert ready.status_code == 200 and set(ready.json()["serving"]) == reachable
    for name in MODELS:
        answer = httpx.get(f"{served}/readyz/{name}", headers=headers, timeout=10)
        assert answer.status_code == (200 if name in reachable else 404)


def test_without_a_credential_the_api_refuses_and_probes_reveal_no_tenant(served):
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=f"{served}/v1", api_key="x", max_retries=0,
                      default_headers={"Authorization": ""}).models.list()
    assert refused.value.status_code == 401 and refused.value.body["code"] == "Unauthenticated"
    for path in ("/healthz", "/readyz", "/status", "/metrics"):
        answer = httpx.get(f"{served}{path}", timeout=10)
        assert not any(name in answer.text for name in (*MODELS, *MODELS.values())), path
    assert httpx.get(f"{served}/readyz", timeout=10).status_code == 200  # the kubelet still gets its answer
    assert httpx.get(f"{served}/healthz", timeout=10).status_code == 200
    assert httpx.get(f"{served}/metrics", timeout=10).status_code == 401


def test_metrics_on_the_api_port_need_access_to_every_served_model(served):
    assert httpx.get(f"{served}/metrics", headers={"Authorization": f"Bearer {KEYS['team-a']}"},
                     timeout=10).status_code == 401


class _Reviews:
    def __init__(self):
        self.calls = 0
        self.fail = False

    def token_review(self, token):
        self.calls += 1
        if self.fail:
            raise ConnectionError("API server down")
        return ("system:serviceaccount:team-a:client", ()) if token == "token-a" else None

    def access_review(self, user, groups, namespace, name):
        self.calls += 1
        if self.fail:
            raise ConnectionError("API server down")
        return namespace == "team-a"

    def api_key(self, namespace):
        return None


def test_answers_are_cached_for_a_while_and_a_failing_api_server_denies():
    now = [0.0]
    reviews = _Reviews()
    authorizer = Authorizer(reviews, ttl_s=60, clock=lambda: now[0])
    assert authorizer.access("Bearer token-a").allows("team-a", "alpha")
    calls = reviews.calls
    assert authorizer.access("Bearer token-a").allows("team-a", "alpha") and reviews.calls == calls  # cached
    reviews.fail = True
    assert not authorizer.access("Bearer token-c").allows("team-a", "alpha")  # failure: denied, not cached
    now[0] = 61.0
    assert not authorizer.access("Bearer token-a").allows("team-a", "alpha")  # expired, then the API fails
    reviews.fail = False
    assert authorizer.access("Bearer token-a").allows("team-a", "alpha")
    assert not authorizer.access(None).authenticated and not authorizer.access("Basic abc").authenticated
