"""Cluster mode's pure pieces: which profile wins, what lands under profiles/measured/, which Application
syncs a model, the backoff, and the metrics endpoints."""
from __future__ import annotations

import dataclasses
import random
import urllib.error
import urllib.request

import pytest
import yaml

from controller.cli.common import from_directory

from controller.cli.commands import _parser
from controller.observe.facts import ProfileDocument
from controller.cli.cluster_loop import ClusterReconciler
from controller.passes.cluster_pass import ModelView, application_for, render_in_cluster, status_model
from controller.passes.measured import (MEASURED_DIR, MEASURED_HEADER, ClusterFacts, ProfileRequest,
                                        measured_profiles)
from controller.inputs.load import combine, parse_model
from controller.inputs.reader import read_repo
from controller.cli.metrics import ControllerMetrics, Health, MetricsServer
from controller.rendering.names import profile_configmap_name
from controller.types import GpuSlot, InputError, Source
from tests.cluster_loop_support import ESTIMATED, PRODUCT, QWEN, measured_profile, model_doc
from tests.conftest import REPO_ROOT
from tests.factories import toy_profile

MEASURED_PATH = f"{MEASURED_DIR}{PRODUCT}/qwen--qwen2.5-0.5b-instruct.yaml"
SLOT = GpuSlot(node="gpu-1", index=0, product=PRODUCT, memory_bytes=23034 << 20)
PROFILE_CM = profile_configmap_name(QWEN, "main", PRODUCT)
REQUEST = ProfileRequest(QWEN, "main", PRODUCT)


def _profile(source: str, file: str, model: str = "org/toy"):
    return dataclasses.replace(toy_profile(model), source=source, file=file)


PROFILE_CASES = [
    # id, profiles (source, file), the file kept, the files reported as duplicates
    ("measured-supersedes-estimated", [("estimated", "e.yaml"), ("measured", "m.yaml")], ["m.yaml"], []),
    ("estimated-alone-is-used", [("estimated", "e.yaml")], ["e.yaml"], []),
    ("two-measured-are-both-errors", [("measured", "m1.yaml"), ("measured", "m2.yaml")], [], ["m1.yaml", "m2.yaml"]),
    ("two-estimated-are-both-errors", [("estimated", "e1.yaml"), ("estimated", "e2.yaml")], [],
     ["e1.yaml", "e2.yaml"]),
    ("two-measured-beat-no-estimate", [("estimated", "e.yaml"), ("measured", "m1.yaml"), ("measured", "m2.yaml")],
     [], ["m1.yaml", "m2.yaml"]),
]


@pytest.mark.parametrize("given,kept,duplicates", [c[1:] for c in PROFILE_CASES], ids=[c[0] for c in PROFILE_CASES])
def test_which_profile_of_a_key_is_used(given, kept, duplicates):
    inputs = combine([], [_profile(source, file) for source, file in given], [])
    assert [p.file for p in inputs.profiles] == kept
    assert [(e.file, e.reason) for e in inputs.errors] == [(f, "DuplicateProfile") for f in duplicates]


def test_profiles_of_other_keys_are_untouched_by_a_duplicate():
    inputs = combine([], [_profile("measured", "a1.yaml", "org/a"), _profile("measured", "a2.yaml", "org/a"),
                          _profile("estimated", "b.yaml", "org/b")], [])
    assert [p.file for p in inputs.profiles] == ["b.yaml"]
    assert "a second measured profile for org/a on NVIDIA-TEST is in a2.yaml" in inputs.errors[0].message


def _document(namespace: str, name: str, doc: dict) -> ProfileDocument:
    return ProfileDocument(namespace=namespace, name=name, text=yaml.safe_dump(doc))


def test_a_configmap_profile_is_filed_under_profiles_measured():
    found = measured_profiles([_document("llm", PROFILE_CM, measured_profile())], {("llm", PROFILE_CM): REQUEST})
    assert list(found.files) == [MEASURED_PATH]
    assert found.files[MEASURED_PATH].startswith(MEASURED_HEADER)
    assert yaml.safe_load(found.files[MEASURED_PATH]) == measured_profile()
    assert [(p.file, p.source, p.model) for p in found.profiles] == [(MEASURED_PATH, "measured", QWEN)]
    assert found.sources == {MEASURED_PATH: f"ConfigMap/llm/{PROFILE_CM}"}
    assert found.errors == () and found.ignored == ()


def test_one_model_profiled_in_two_namespaces_keeps_the_first_by_namespace():
    later = {**measured_profile(), "method": "second run"}
    documents = [_document("team-b", PROFILE_CM, later), _document("llm", PROFILE_CM, measured_profile())]
    found = measured_profiles(documents, {("llm", PROFILE_CM): REQUEST, ("team-b", PROFILE_CM): REQUEST})
    assert found.sources == {MEASURED_PATH: f"ConfigMap/llm/{PROFILE_CM}"}
    assert len(found.profiles) == 1 and found.errors == ()


def test_a_broken_configmap_profile_is_an_error_that_names_the_configmap():
    broken = {**measured_profile(), "weights": {**measured_profile()["weights"], "totalBytes": 1}}
    found = measured_profiles([_document("llm", PROFILE_CM, broken)], {("llm", PROFILE_CM): REQUEST})
    assert found.files == {} and found.profiles == ()
    assert [(e.file, e.reason) for e in found.errors] == [(f"ConfigMap/llm/{PROFILE_CM}", "ProfileTotalMismatch")]


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    (root / "models/llm").mkdir(parents=True)
    (root / "models/llm/chat.yaml").write_text(yaml.safe_dump(model_doc()))
    (root / f"profiles/{PRODUCT}").mkdir(parents=True)
    (root / f"profiles/{PRODUCT}/qwen--qwen2.5-0.5b-instruct.yaml").write_text(ESTIMATED)
    (root / "gpus.yaml").write_text("this inventory is ignored in cluster mode: [")
    return root


def test_cluster_render_plans_on_node_slots_with_the_measured_profile(tree):
    facts = ClusterFacts(slots=(SLOT,), profiles=(_document("llm", PROFILE_CM, measured_profile()),))
    rendered = render_in_cluster(read_repo(tree), facts)
    assert rendered.output.inputs.errors == ()  # gpus.yaml is not read; the estimate is superseded
    assert rendered.output.inputs.slots == (SLOT,)
    assert [p.source for p in rendered.output.inputs.profiles] == ["measured"]
    expected = measured_profiles(facts.profiles, {("llm", PROFILE_CM): REQUEST}).files[MEASURED_PATH]
    assert rendered.files[MEASURED_PATH] == expected.encode()
    assert rendered.output.plan.decisions[0].slot == SLOT.id
    assert f"profile committed: {MEASURED_PATH} (from ConfigMap/llm/{PROFILE_CM})" in rendered.message


def test_a_committed_measured_profile_is_replaced_by_the_cluster_copy_and_kept_without_it(tree):
    (tree / MEASURED_PATH).parent.mkdir(parents=True)
    (tree / MEASURED_PATH).write_text(MEASURED_HEADER + yaml.safe_dump({**measured_profile(), "method": "old run"}))
    with_configmap = render_in_cluster(read_repo(tree), ClusterFacts((SLOT,), (_document("llm", PROFILE_CM, measured_profile()),)))
    assert with_configmap.output.inputs.errors == ()  # not a duplicate of itself
    assert b"old run" not in with_configmap.files[MEASURED_PATH]

    without = render_in_cluster(read_repo(tree), ClusterFacts((SLOT,), ()))
    assert MEASURED_PATH not in without.files and MEASURED_PATH in without.keep
    assert [p.file for p in without.output.inputs.profiles] == [MEASURED_PATH]


def _app(name: str, *paths: str | None, multi: bool = False) -> dict:
    if not paths:
        return {"metadata": {"name": name}}
    if multi:
        return {"metadata": {"name": name}, "spec": {"sources": [{"path": p} for p in paths]}}
    return {"metadata": {"name": name}, "spec": {"source": {"path": paths[0]}}}


APP_CASES = [
    ("source-path-holds-the-files", ["rendered/llm/job-x.yaml"], [_app("models", "models"), _app("r", "rendered")],
     "r"),
    ("deepest-directory-wins", ["rendered/llm/a.yaml"], [_app("all", "."), _app("llm", "rendered/llm/")], "llm"),
    ("files-split-across-directories-need-a-common-one", ["rendered/a/x.yaml", "rendered/b/y.yaml"],
     [_app("a", "rendered/a"), _app("b", "rendered/b")], None),
    ("multi-source-application", ["rendered/llm/x.yaml"], [_app("m", "charts", "rendered", multi=True)], "m"),
    ("no-spec-means-the-whole-repository", ["rendered/llm/x.yaml"], [_app("bare")], "bare"),
    ("nothing-rendered-takes-the-first", [], [_app("first", "rendered"), _app("second", "rendered")], "first"),
    ("no-application-at-all", ["rendered/x.yaml"], [], None),
]


@pytest.mark.parametrize("paths,apps,expected", [c[1:] for c in APP_CASES], ids=[c[0] for c in APP_CASES])
def test_the_application_that_syncs_a_model(paths, apps, expected):
    found = application_for(paths, apps)
    assert (found["metadata"]["name"] if found else None) == expected


def test_backoff_doubles_with_jitter_up_to_the_cap():
    rng = random.Random(7)
    reconciler = ClusterReconciler(None, None, None, jitter=rng.uniform, backoff_base_s=1.0, max_backoff_s=300.0)
    for failures in range(1, 13):
        ceiling = min(300.0, 2.0 ** (failures - 1))
        waits = {reconciler.backoff(failures) for _ in range(20)}
        assert all(ceiling / 2 <= w <= ceiling for w in waits), failures
        assert len(waits) > 1, "no jitter"


class _Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_metrics_health_and_readiness_endpoints():
    metrics, clock = ControllerMetrics(), _Clock()
    health = Health(stall_after_s=60, clock=clock)
    metrics.commits.inc()
    metrics.modes({"resident": 2, "pending": 1})
    metrics.error("GitUnreachable")
    metrics.pass_done(0.3, "ok", 1_800_000_000)
    server = MetricsServer(metrics, health, port=0, host="127.0.0.1")
    try:
        code, body = _get(server.port, "/metrics")
        assert code == 200
        for line in ("gpushare_git_commits_total 1.0", 'gpushare_models{mode="resident"} 2.0',
                     'gpushare_models{mode="swap"} 0.0', 'gpushare_models{mode="pending"} 1.0',
                     'gpushare_reconcile_errors_total{reason="GitUnreachable"} 1.0',
                     'gpushare_reconcile_pass_duration_seconds_count{result="ok"} 1.0'):
            assert line in body, line
        assert _get(server.port, "/readyz") == (503, "the first reconcile pass has not finished yet\n")
        assert _get(server.port, "/healthz")[0] == 200
        health.beat()
        assert _get(server.port, "/readyz") == (200, "ok\n")
        clock.now += 61
        code, body = _get(server.port, "/healthz")
        assert code == 503 and "the loop is stuck" in body
        assert _get(server.port, "/other")[0] == 404
    finally:
        server.close()


def test_the_deployment_args_parse_with_the_cluster_flags():
    """config/manager/deployment.yaml stays in sync with add_cluster_arguments (and the probes with the port)."""
    deployment = yaml.safe_load((REPO_ROOT / "config/manager/deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    settings = yaml.safe_load((REPO_ROOT / "config/manager/config.yaml").read_text())["data"]
    env = {**settings, "POD_NAME": "pod-a", "POD_NAMESPACE": "gpushare-system"}
    args = _parser().parse_args([_substitute(a, env) for a in container["args"]])
    assert args.kube and not args.once and args.interval == 30.0
    assert str(args.write_back) == "branch:gpushare/review"  # review by default, never straight to the branch
    assert args.argocd_application == [("argocd", "gpushare-rendered")]
    assert (args.identity, args.lease_namespace) == ("pod-a", "gpushare-system")
    assert args.metrics_port == container["ports"][0]["containerPort"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert str(args.git_credentials_dir) == mounts["git-credentials"]
    assert str(args.workdir) == mounts["workdir"]


@pytest.mark.parametrize("files, token, ssh, known", [
    pytest.param({"token": "t"}, "token", None, None, id="https-token"),
    pytest.param({"ssh-privatekey": "k", "known_hosts": "h"}, None, "ssh-privatekey", "known_hosts", id="ssh-key"),
    pytest.param({"ssh-privatekey": "k"}, None, "ssh-privatekey", None, id="ssh-without-known-hosts"),
    pytest.param({}, None, None, None, id="empty-secret"),
])
def test_the_credentials_directory_picks_https_or_ssh_from_the_secret_alone(tmp_path, files, token, ssh, known):
    """Switching HTTPS and SSH is a change of the Secret gpushare-git, never of the Deployment's arguments."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    args = _parser().parse_args(["reconcile", "--kube", "--repo", "x", "--git-credentials-dir", str(tmp_path)])
    from_directory(args)
    picked = (args.git_token_file, args.git_ssh_key_file, args.git_known_hosts_file)
    assert picked == tuple(None if n is None else tmp_path / n for n in (token, ssh, known))


@pytest.mark.parametrize("argv, warned", [
    pytest.param(["--kube", "--write-back", "direct"], True, id="cluster-direct-warns"),
    pytest.param(["--offline", "--interval", "30s"], True, id="polling-direct-by-default-warns"),
    pytest.param(["--kube", "--write-back", "branch:gpushare/review"], False, id="review-branch-quiet"),
    pytest.param(["--kube", "--write-back", "pr:gpushare/review"], False, id="pull-request-quiet"),
    pytest.param(["--offline", "--once"], False, id="one-offline-pass-quiet"),
])
def test_direct_write_back_is_an_explicit_choice_warned_about(argv, warned, caplog):
    from controller.cli.reconcile_cmd import warn_direct

    args = _parser().parse_args(["reconcile", "--repo", "x", "--branch", "main", *argv])
    with caplog.at_level("WARNING", logger="gpushare.reconcile"):
        assert warn_direct(args) is warned
    assert ("commits straight to main" in caplog.text) is warned


@pytest.mark.parametrize("argv, environ, forge, api", [
    pytest.param([], {"GPUSHARE_FORGE": "gitea", "GPUSHARE_FORGE_API_URL": "https://git.test/api/v1"}, "gitea",
                 "https://git.test/api/v1", id="install-settings"),
    pytest.param([], {"GPUSHARE_FORGE": "", "GPUSHARE_FORGE_API_URL": " "}, None, None, id="empty-is-inferred"),
    pytest.param(["--forge", "gitlab"], {"GPUSHARE_FORGE": "gitea"}, "gitlab", None, id="flag-wins"),
])
def test_the_forge_settings_come_from_the_install(argv, environ, forge, api):
    from controller.cli.common import forge_from_settings

    args = _parser().parse_args(["reconcile", "--kube", "--repo", "x", *argv])
    forge_from_settings(args, environ)
    assert (args.forge, args.forge_api_url) == (forge, api)


def _substitute(arg: str, env: dict[str, str]) -> str:
    for key, value in env.items():
        arg = arg.replace(f"$({key})", value)
    return arg


def _stored(generation: int = 3, **spec) -> dict:
    doc = model_doc(**spec)
    return {**doc, "metadata": {**doc["metadata"], "generation": generation, "resourceVersion": "42"}}


def _git_view(error: bool = False, **spec) -> ModelView:
    model, _ = parse_model(model_doc(**spec), Source("models/llm/chat.yaml"))
    problem = InputError("models/llm/chat.yaml", 0, "spec", "broken", "fix it", object="llm/chat") if error else None
    return ModelView(model=model, error=problem)


STATUS_MODEL_CASES = [
    # id, object in the cluster, view from git, expected (budget, generation) or None (status waits)
    ("same-spec-takes-the-cluster-generation", _stored(), _git_view(), (4 << 30, 3)),
    ("cluster-ahead-of-git-waits", _stored(budget="8Gi"), _git_view(), None),
    ("git-ahead-of-cluster-waits", _stored(), _git_view(budget="8Gi"), None),
    ("broken-git-document-reports-on-the-cluster-generation", _stored(budget="8Gi"), _git_view(error=True),
     (4 << 30, 3)),
    ("not-in-git-uses-the-cluster-object", _stored(budget="8Gi"), None, (8 << 30, 3)),
    ("unusable-cluster-spec-still-gets-a-status", _stored(budget="lots"), None, (0, 3)),
]


@pytest.mark.parametrize("obj,view,expected", [c[1:] for c in STATUS_MODEL_CASES],
                         ids=[c[0] for c in STATUS_MODEL_CASES])
def test_which_model_a_status_is_written_for(obj, view, expected):
    model = status_model(obj, view)
    assert (None if model is None else (model.budget_bytes, model.generation)) == expected
