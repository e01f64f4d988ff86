"""Many clusters from one repository, without git: placement, the per-cluster read, plan and render, the commands.

A three-cluster fleet (examples/regions: eu-1 and us-1 labelled env=prod, staging env=staging) is read cluster by
cluster through the one reader and planned by the one pass: each cluster plans its own inventory and the models
its placement selects, into its own paths. Every bad placement or cluster folder is an error at its path, with
the fix, and moves no model off a cluster that ran it. `validate`, `plan` and `explain` take the repository whole
or one cluster. The single-cluster layout is untouched (its goldens are tests/test_compose_golden.py's).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from controller.cli.commands import main
from controller.cli.offline import pass_over
from controller.inputs.clusters import Catalog, placed
from controller.inputs.layout import Layout
from controller.inputs.reader import ClusterNotFound, read_repo, repository_clusters
from controller.passes.reconcile import guarded_change, run_pass
from controller.placement import EVERYWHERE, Placement, Requirement, Selector
from controller.types import ElasticModel, Source
from tests.conftest import REPO_ROOT

REGIONS = REPO_ROOT / "examples" / "regions"
LABELS = {"eu-1": {"region": "eu", "env": "prod"}, "us-1": {"region": "us", "env": "prod"},
          "staging": {"env": "staging"}}
PLANNED = {"eu-1": {"llm/assistant-8b", "llm/chat-small", "research/analyst-70b"},
           "us-1": {"llm/assistant-8b", "llm/chat-small", "llm/coder-32b", "llm/summarizer"},
           "staging": {"llm/chat-canary", "llm/chat-small", "llm/summarizer"}}


@pytest.fixture
def regions(tmp_path) -> Path:
    root = tmp_path / "regions"
    shutil.copytree(REGIONS, root)
    return root


def _write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


def _model(name: str = "m", placement: dict | None = None, budget: str = "4Gi") -> str:
    spec = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "memoryBudget": budget}
    if placement is not None:
        spec["placement"] = placement
    return yaml.safe_dump({"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
                           "metadata": {"name": name, "namespace": "llm"}, "spec": spec})


# ---------------------------------------------------------------- the placement rule (Kubernetes LabelSelector)

SELECTS = [  # (case, placement, cluster, labels, selected)
    ("no-placement-selects-every-cluster", EVERYWHERE, "eu-1", {}, True),
    ("named-cluster", Placement(clusters=("eu-1", "us-1")), "us-1", {}, True),
    ("unnamed-cluster", Placement(clusters=("eu-1",)), "us-1", {}, False),
    ("empty-selector-matches-all", Placement(selector=Selector()), "eu-1", {"env": "prod"}, True),
    ("match-labels", Placement(selector=Selector((("env", "prod"),))), "eu-1", {"env": "prod", "x": "y"}, True),
    ("match-labels-other-value", Placement(selector=Selector((("env", "prod"),))), "s", {"env": "staging"}, False),
    ("match-labels-missing-key", Placement(selector=Selector((("env", "prod"),))), "s", {}, False),
    ("in", Placement(selector=Selector(expressions=(Requirement("region", "In", ("eu", "us")),))), "c",
     {"region": "us"}, True),
    ("in-without-key", Placement(selector=Selector(expressions=(Requirement("region", "In", ("eu",)),))), "c",
     {}, False),
    ("not-in-without-key-matches", Placement(selector=Selector(expressions=(Requirement("r", "NotIn", ("eu",)),))),
     "c", {}, True),
    ("not-in", Placement(selector=Selector(expressions=(Requirement("r", "NotIn", ("eu",)),))), "c", {"r": "eu"},
     False),
    ("exists", Placement(selector=Selector(expressions=(Requirement("gpu", "Exists"),))), "c", {"gpu": ""}, True),
    ("does-not-exist", Placement(selector=Selector(expressions=(Requirement("gpu", "DoesNotExist"),))), "c",
     {"gpu": "h200"}, False),
    ("names-and-selector-both-hold", Placement(("eu-1",), Selector((("env", "prod"),))), "eu-1", {"env": "prod"},
     True),
    ("named-but-selector-fails", Placement(("eu-1",), Selector((("env", "staging"),))), "eu-1", {"env": "prod"},
     False),
]


@pytest.mark.parametrize("placement, cluster, labels, selected", [c[1:] for c in SELECTS],
                         ids=[c[0] for c in SELECTS])
def test_a_placement_selects_as_karmada_and_a_label_selector_do(placement, cluster, labels, selected):
    assert placement.selects(cluster, labels) is selected


def _em(name: str, placement: Placement) -> ElasticModel:
    return ElasticModel(name, "llm", "Qwen/Qwen2.5-0.5B-Instruct", 1 << 32, source=Source(f"models/{name}.yaml"),
                        placement=placement)


def test_placed_keeps_each_clusters_models_and_errs_on_the_others_once():
    catalog = Catalog(LABELS)
    models = [_em("everywhere", EVERYWHERE), _em("prod", Placement(selector=Selector((("env", "prod"),)))),
              _em("typo", Placement(clusters=("eu-9",))), _em("nowhere", Placement(selector=Selector((("a", "b"),))))]
    kept, errors = placed(models, "eu-1", catalog)
    assert [m.name for m in kept] == ["everywhere", "prod"]
    assert [(e.object, e.reason, e.path) for e in errors] == [
        ("llm/typo", "UnknownCluster", "spec.placement.clusters[0]"),
        ("llm/nowhere", "NoClusterSelected", "spec.placement.clusterSelector")]
    assert "eu-1 {env=prod,region=eu}" in errors[1].message
    assert [m.name for m in placed(models, "staging", catalog)[0]] == ["everywhere"]


def test_no_verdict_on_a_selector_while_a_clusters_labels_cannot_be_read():
    kept, errors = placed([_em("nowhere", Placement(selector=Selector((("a", "b"),))))], "eu-1",
                          Catalog({"eu-1": {}, "us-1": None}))
    assert (kept, errors) == ([], [])


def test_a_placement_in_the_single_cluster_layout_is_an_error_with_its_fix():
    kept, errors = placed([_em("a", EVERYWHERE), _em("b", Placement(clusters=("eu-1",)))], None, None)
    assert [m.name for m in kept] == ["a"]
    assert [(e.object, e.reason) for e in errors] == [("llm/b", "PlacementWithoutClusters")]
    assert "clusters/<name>/gpus.yaml" in errors[0].fix


# ---------------------------------------------------------------- the reader, one cluster at a time

def test_each_cluster_reads_its_own_inventory_and_the_models_that_select_it(regions):
    assert repository_clusters(regions) == ("eu-1", "staging", "us-1")
    for cluster, refs in PLANNED.items():
        tree = read_repo(regions, cluster=cluster)
        assert {m.ref for m in tree.models} == refs, cluster
        assert {s.node.split("-")[0] for s in tree.slots} == {cluster.split("-")[0]}, "its own gpus.yaml"
        assert tree.layout == Layout(cluster) and tree.clusters == ("eu-1", "staging", "us-1")
        assert tree.inputs.errors == ()
    assert read_repo(regions, cluster="us-1").prices == {"NVIDIA-H200": 3.5, "NVIDIA-L4": 0.8}


@pytest.mark.parametrize("cluster, fits", [("eu-1", False), (None, True)], ids=["cluster-in-one", "none-in-one"])
def test_asking_for_a_cluster_the_layout_lacks_is_refused_with_the_fix(regions, tmp_path, cluster, fits):
    single = tmp_path / "single"
    shutil.copytree(REPO_ROOT / "examples" / "fleet", single)
    if fits:
        read_repo(single, cluster=cluster)
    else:
        with pytest.raises(ClusterNotFound, match="no clusters/ folder"):
            read_repo(single, cluster=cluster)
    for wrong in (None, "eu-9"):
        with pytest.raises(ClusterNotFound, match="eu-1, staging, us-1") as caught:
            read_repo(regions, cluster=wrong)
        assert "--cluster" in caught.value.fix


FOLDER_ERRORS = [  # (case, files to write, reason, where)
    ("bad-cluster-name", {"clusters/EU_1/gpus.yaml": "nodes: []\n"}, "InvalidClusterName", "clusters/EU_1/"),
    ("folder-without-gpus-yaml", {"clusters/ap-1/README.md": "soon\n"}, "MissingInventory",
     "clusters/ap-1/gpus.yaml"),
    ("root-gpus-yaml-beside-clusters", {"gpus.yaml": "nodes: []\n"}, "TwoLayouts", "gpus.yaml"),
    ("labels-kubernetes-refuses", {"clusters/ap-1/gpus.yaml": "apiVersion: gpushare.dev/v1alpha1\n"
                                   "kind: GPUInventory\nlabels: {\"bad key!\": x}\nnodes: []\n"},
     "InvalidLabel", "clusters/ap-1/gpus.yaml"),
]


@pytest.mark.parametrize("files, reason, where", [c[1:] for c in FOLDER_ERRORS], ids=[c[0] for c in FOLDER_ERRORS])
def test_a_bad_cluster_folder_is_an_error_at_its_path_and_the_others_go_on(regions, files, reason, where):
    for rel, text in files.items():
        _write(regions, rel, text)
    tree = read_repo(regions, cluster="eu-1")
    found = [e for e in tree.inputs.errors if e.reason == reason]
    assert [e.file for e in found] == [where] and found[0].fix
    assert {m.ref for m in tree.models} == PLANNED["eu-1"], "the other clusters plan as before"
    assert "EU_1" not in (repository_clusters(regions) or ())


MODEL_ERRORS = [  # (case, placement, reason, path)
    ("unknown-cluster", {"clusters": ["eu-1", "eu-9"]}, "UnknownCluster", "spec.placement.clusters[1]"),
    ("selector-matches-none", {"clusterSelector": {"matchLabels": {"env": "qa"}}}, "NoClusterSelected",
     "spec.placement.clusterSelector"),
    ("names-and-selector-disjoint", {"clusters": ["staging"], "clusterSelector": {"matchLabels": {"env": "prod"}}},
     "NoClusterSelected", "spec.placement.clusterSelector"),
    ("in-without-values", {"clusterSelector": {"matchExpressions": [{"key": "env", "operator": "In"}]}},
     "InvalidSelector", "spec.placement.clusterSelector.matchExpressions[0].values"),
    ("exists-with-values", {"clusterSelector": {"matchExpressions": [{"key": "env", "operator": "Exists",
                                                                      "values": ["x"]}]}},
     "InvalidSelector", "spec.placement.clusterSelector.matchExpressions[0].values"),
    ("label-value-kubernetes-refuses", {"clusterSelector": {"matchLabels": {"env": "a b"}}}, "InvalidSelector",
     "spec.placement.clusterSelector.matchLabels.env"),
    ("bad-cluster-name", {"clusters": ["EU"]}, "InvalidName", "spec.placement.clusters[0]"),
    ("unknown-operator", {"clusterSelector": {"matchExpressions": [{"key": "env", "operator": "Gt"}]}},
     "InvalidValue", "spec.placement.clusterSelector.matchExpressions[0].operator"),
]


@pytest.mark.parametrize("placement, reason, path", [c[1:] for c in MODEL_ERRORS], ids=[c[0] for c in MODEL_ERRORS])
def test_a_bad_placement_is_an_error_at_the_model_in_every_cluster(regions, placement, reason, path):
    _write(regions, "models/llm/placed.yaml", _model("placed", placement))
    for cluster in LABELS:
        tree = read_repo(regions, cluster=cluster)
        found = [e for e in tree.inputs.errors if e.file == "models/llm/placed.yaml"]
        assert [(e.reason, e.path) for e in found] == [(reason, path)], cluster
        assert "llm/placed" not in {m.ref for m in tree.models}


BROKEN_EU = _model("broken", {"clusters": ["eu-1"]}, budget="lots")
FINE_US = _model("fine", {"clusters": ["us-1"]})
PLACED_ELSEWHERE = [  # (case, text of models/llm/placed.yaml, {cluster: what it plans of it}, clusters reporting)
    ("block-yaml-placed-on-one", BROKEN_EU, {"eu-1": set(), "us-1": set(), "staging": set()}, {"eu-1"}),
    ("anchors-read-in-full", BROKEN_EU.replace("spec:", "spec: &spec"), {"eu-1": set(), "us-1": set()}, {"eu-1"}),
    ("one-file-two-clusters", BROKEN_EU + "---\n" + FINE_US, {"eu-1": set(), "us-1": {"llm/fine"}}, {"eu-1"}),
    ("unreadable-yaml-everywhere", BROKEN_EU + "  slo: [\n", {"eu-1": set(), "us-1": set(), "staging": set()},
     {"eu-1", "us-1", "staging"}),
    ("no-placement-everywhere", _model("everywhere", budget="lots"), {"us-1": set()}, {"eu-1", "us-1", "staging"}),
    ("a-broken-line-outside-the-placement", _model("bent", {"clusters": ["eu-1"]}).replace(
        "  model:", "   model:"), {"eu-1": set(), "us-1": set()}, {"eu-1"}),
]


@pytest.mark.parametrize("text, plans, reporting", [c[1:] for c in PLACED_ELSEWHERE],
                         ids=[c[0] for c in PLACED_ELSEWHERE])
def test_a_model_placed_on_other_clusters_only_is_theirs_to_plan_and_report(regions, text, plans, reporting):
    _write(regions, "models/llm/placed.yaml", text)
    for cluster in LABELS:
        tree = read_repo(regions, cluster=cluster)
        errors = [e for e in tree.inputs.errors if e.file == "models/llm/placed.yaml"]
        assert bool(errors) == (cluster in reporting), (cluster, errors)
        if cluster in plans:
            assert {m.ref for m in tree.models} - PLANNED[cluster] == plans[cluster], cluster


def test_a_file_placed_on_other_clusters_only_is_not_read_further(regions, monkeypatch):
    _write(regions, "models/llm/eu.yaml", "---\n".join(_model(f"m{i}", {"clusters": ["eu-1"]}) for i in range(3)))
    _write(regions, "models/llm/mixed.yaml", _model("a", {"clusters": ["eu-1"]}) + "---\n" + _model("b"))
    import controller.inputs.reader as reader
    parsed: dict[str, list[str]] = {}
    real = reader.load_documents

    def counting(text, rel, *args):
        parsed.setdefault(cluster, []).append(rel)
        return real(text, rel, *args)

    monkeypatch.setattr(reader, "load_documents", counting)
    for cluster in ("eu-1", "us-1"):
        refs = {m.ref for m in read_repo(regions, cluster=cluster).models}
        assert ("llm/m0" in refs) == (cluster == "eu-1") and "llm/b" in refs
    assert "models/llm/eu.yaml" in parsed["eu-1"] and "models/llm/eu.yaml" not in parsed["us-1"]
    assert "models/llm/mixed.yaml" in parsed["us-1"], "a file with one model of its own is read in full"


def test_a_model_in_a_clusters_own_folder_is_that_clusters_alone(regions):
    assert {c for c in LABELS if "llm/chat-canary" in {m.ref for m in read_repo(regions, cluster=c).models}} == {
        "staging"}
    _write(regions, "clusters/staging/models/llm/canary.yaml",
           (regions / "clusters/staging/models/llm/canary.yaml").read_text() + "  placement: {clusters: [eu-1]}\n")
    tree = read_repo(regions, cluster="staging")
    assert [(e.reason, e.path) for e in tree.inputs.errors] == [("PlacementInClusterFolder", "spec.placement")]
    assert "llm/chat-canary" not in {m.ref for m in read_repo(regions, cluster="eu-1").models}
    assert not any(e.reason == "PlacementInClusterFolder" for e in read_repo(regions, cluster="eu-1").inputs.errors)


def test_a_broken_placement_keeps_the_model_where_it_ran_from_its_last_good_spec(regions):
    _write(regions, "models/llm/placed.yaml", _model("placed", {"clusters": ["eu-1"]}))
    first = run_pass(read_repo(regions, cluster="eu-1"))
    _land(regions, first)
    _write(regions, "models/llm/placed.yaml", _model("placed", {"clusters": ["eu-1", "eu-9"]}))
    second = run_pass(read_repo(regions, cluster="eu-1"))
    assert "llm/placed" in second.revived and "llm/placed" in {d.namespace + "/" + d.name
                                                               for d in second.plan.decisions}
    assert "rendered/eu-1/llm/elasticmodel-placed.yaml" in second.keep, "its object stays as the last pass wrote it"
    assert "rendered/eu-1/llm/elasticmodel-placed.yaml" not in second.files
    assert not any("placed" in d.name for d in run_pass(read_repo(regions, cluster="us-1")).plan.decisions)


def _land(root: Path, output) -> None:
    """Write a pass's files into the directory, as gitops would commit them (and remove its other owned files)."""
    for prefix in output.layout.generated:
        shutil.rmtree(root / prefix, ignore_errors=True)
    for path, data in output.files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)


def test_a_broken_cluster_inventory_keeps_its_labels_and_models_from_the_last_good_copy(regions):
    _land(regions, run_pass(read_repo(regions, cluster="eu-1")))
    _write(regions, "clusters/eu-1/gpus.yaml", "labels: [not, a, mapping\n")
    tree = read_repo(regions, cluster="eu-1")
    assert tree.held == ("clusters/eu-1/gpus.yaml",)
    assert {m.ref for m in tree.models} == PLANNED["eu-1"], "assistant-8b still selects it (env=prod)"
    assert [s.node for s in tree.slots] == ["eu-h200-1"]


# ---------------------------------------------------------------- the pass: one tree per cluster

def test_each_clusters_pass_writes_its_own_paths_and_its_elastic_models(regions):
    for cluster, refs in PLANNED.items():
        output = run_pass(read_repo(regions, cluster=cluster))
        assert all(p.startswith((f"rendered/{cluster}/", f"decisions/{cluster}/")) for p in output.files), cluster
        models = {p for p in output.files if "/elasticmodel-" in p}
        assert models == {f"rendered/{cluster}/{ref.split('/')[0]}/elasticmodel-{ref.split('/')[1]}.yaml"
                          for ref in refs}
        assert output.message.startswith(f"gpushare({cluster}): ")
        plan_md = output.files[f"rendered/{cluster}/PLAN.md"].decode()
        assert plan_md.startswith(f"# gpushare plan: cluster {cluster}\n")
        assert output.reads[0] == ":(top)" and f":(exclude)rendered/{cluster}" not in output.reads
    summarizer = yaml.safe_load(run_pass(read_repo(regions, cluster="staging")).files[
        "rendered/staging/llm/elasticmodel-summarizer.yaml"])
    written = yaml.safe_load((REGIONS / "models/llm/chat.yaml").read_text().split("---")[-1])
    assert summarizer["spec"] == {k: v for k, v in written["spec"].items() if k != "placement"}, "as written"
    assert summarizer["metadata"]["annotations"] == {"gpushare.dev/source": "models/llm/chat.yaml"}
    assert "status" not in summarizer


def test_the_prune_guard_of_one_cluster_never_counts_another_clusters_objects(regions):
    outputs = {c: run_pass(read_repo(regions, cluster=c)) for c in LABELS}
    upstream = [p for output in outputs.values() for p in output.files]
    for cluster, output in outputs.items():
        own = [p for p in upstream if p.startswith(Layout(cluster).generated)]
        assert guarded_change(own, output.files, 0.0, layout=Layout(cluster)).hold is None
    assert guarded_change(upstream, {}, 0.5, layout=Layout("us-1")).hold.before == len(
        [p for p in outputs["us-1"].files if p.startswith("rendered/us-1/") and not p.endswith("PLAN.md")])


def test_measured_profiles_are_each_clusters_own_and_shared_where_another_has_none(regions):
    estimated = yaml.safe_load((REGIONS / "profiles/NVIDIA-H200/qwen--qwen2.5-0.5b-instruct.yaml").read_text())
    for cluster, overhead in (("us-1", 300 << 20), ("staging", 400 << 20)):
        doc = {**estimated, "source": "measured", "method": f"measured in {cluster}", "runtimeOverheadBytes": overhead}
        _write(regions, f"profiles/measured/{cluster}/NVIDIA-H200/qwen--qwen2.5-0.5b-instruct.yaml",
               yaml.safe_dump(doc))
    def used_by(cluster: str):
        return next(p for p in read_repo(regions, cluster=cluster).inputs.profiles
                    if (p.model, p.revision, p.gpu_product) == ("Qwen/Qwen2.5-0.5B-Instruct", "main", "NVIDIA-H200"))
    used = {c: used_by(c) for c in LABELS}
    assert used["us-1"].file == "profiles/measured/us-1/NVIDIA-H200/qwen--qwen2.5-0.5b-instruct.yaml"
    assert used["staging"].file.startswith("profiles/measured/staging/")
    assert used["eu-1"].file.startswith("profiles/measured/staging/"), "another cluster's, the first by name"
    assert all(not e.reason.startswith("Duplicate") for c in LABELS for e in read_repo(regions, cluster=c).inputs.errors)
    tree = read_repo(regions, cluster="eu-1")
    assert not any(p.startswith("decisions/eu-1/_last-good/profiles/measured/") for p in tree.last_good)


# ---------------------------------------------------------------- the commands, the repository whole or one cluster

def test_validate_takes_the_whole_repository_or_one_cluster(regions, capsys):
    assert main(["validate", str(regions)]) == 0
    assert "6 ElasticModel(s)" in capsys.readouterr().out
    _write(regions, "models/llm/placed.yaml", _model("placed", {"clusters": ["eu-9"]}))
    assert main(["validate", str(regions)]) == 1
    out = capsys.readouterr().out
    assert out.count("[UnknownCluster]") == 1, "one error, though every cluster's pass reports it"
    assert main(["validate", "--cluster", "staging", str(regions)]) == 1
    assert main(["validate", "--cluster", "eu-9", str(regions)]) == 2
    assert "eu-1, staging, us-1" in capsys.readouterr().err


def test_plan_json_keeps_its_fields_and_adds_each_clusters_plan(regions, capsys):
    assert main(["plan", str(regions), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["apiVersion"], doc["kind"]) == ("gpushare.dev/v1alpha1", "Plan")
    assert {(d["cluster"], f"{d['namespace']}/{d['name']}") for d in doc["decisions"]} == {
        (c, ref) for c, refs in PLANNED.items() for ref in refs}
    assert sorted(doc["clusters"]) == ["eu-1", "staging", "us-1"]
    assert {f"{d['namespace']}/{d['name']}" for d in doc["clusters"]["us-1"]["decisions"]} == PLANNED["us-1"]
    assert set(doc["clusters"]["us-1"]) == {"decisions", "pending", "errors", "capacity"}
    assert doc["capacity"]["gpusUsed"] == sum(c["capacity"]["gpusUsed"] for c in doc["clusters"].values())
    assert {(p["cluster"], p["product"]) for p in doc["capacity"]["products"]} == {
        ("eu-1", "NVIDIA-H200"), ("staging", "NVIDIA-L4"), ("us-1", "NVIDIA-H200"), ("us-1", "NVIDIA-L4")}
    assert doc["capacity"]["costPerMonth"] is None, "staging has no price: the fleet's total is not known"
    assert main(["plan", str(regions), "-o", "json", "--cluster", "eu-1"]) == 0
    assert list(json.loads(capsys.readouterr().out)["clusters"]) == ["eu-1"]
    assert main(["plan", str(regions)]) == 0
    table = capsys.readouterr().out
    assert [line for line in table.splitlines() if line.startswith("==")] == [
        "== cluster eu-1 ==", "== cluster staging ==", "== cluster us-1 =="]


def test_plan_json_of_the_single_cluster_layout_is_unchanged(capsys):
    assert main(["plan", str(REPO_ROOT / "examples" / "fleet"), "-o", "json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"apiVersion", "kind", "decisions", "pending", "errors",
                                                         "capacity"}


def test_explain_names_the_cluster_or_explains_it_in_each(regions, capsys):
    assert main(["explain", "llm/summarizer", "--repo", str(regions)]) == 0
    out = capsys.readouterr().out
    assert "== cluster staging ==" in out and "== cluster us-1 ==" in out and "== cluster eu-1 ==" not in out
    assert main(["explain", "research/analyst-70b", "--repo", str(regions), "--cluster", "us-1"]) == 1
    assert "in cluster us-1" in capsys.readouterr().err


def test_validate_pass_and_reconcile_render_alike(regions):
    for cluster in LABELS:
        assert pass_over(regions, processes=1, cluster=cluster).files == run_pass(
            read_repo(regions, cluster=cluster)).files


# ---------------------------------------------------------------- right-sizing: one budget, several clusters

GIB = 1 << 30
LARGEST = [  # (case, own proposal GiB, other clusters' records {cluster: (policy, spec GiB, recommended GiB)},
    #         proposed GiB or None)
    ("alone", 6, {}, 6),
    ("another-needs-more", 6, {"us-1": ("Recommend", 4, 8)}, 8),
    ("another-needs-less", 6, {"us-1": ("Recommend", 4, 5)}, 6),
    ("downsize-while-another-keeps-the-budget", 3, {"us-1": ("Recommend", 4, 4)}, None),
    ("downsize-when-all-ask-less", 3, {"us-1": ("Recommend", 4, 2)}, 3),
    ("a-record-of-an-older-budget-is-stale", 3, {"us-1": ("Recommend", 16, 20)}, 3),
]


@pytest.mark.parametrize("own, others, proposed", [c[1:] for c in LARGEST], ids=[c[0] for c in LARGEST])
def test_a_recommend_proposal_takes_the_largest_budget_its_clusters_recommend(own, others, proposed):
    from controller.inputs.rightsizing_records import Record, Records
    from controller.rightsizing.apply import _largest
    from controller.rightsizing.step import Proposal, StepResult, review_branch

    model = ElasticModel("chat", "llm", "Qwen/Qwen2.5-0.5B-Instruct", 4 * GIB)
    proposal = Proposal(model, own * GIB, review_branch(model), "llm/chat: memoryBudget 4.0Gi → x\n\nevidence")
    records = {name: Records({model.key: Record("llm", "chat", policy, spec * GIB, budget * GIB,
                                                directory=Layout(name).rightsizing)})
               for name, (policy, spec, budget) in others.items()}
    result = _largest(StepResult({}, (proposal,)), records, "eu-1")
    assert [p.budget_bytes for p in result.proposals] == ([] if proposed is None else [proposed * GIB])
    if proposed is not None and proposed != own:
        message = result.proposals[0].message
        assert message.startswith(f"llm/chat: memoryBudget 4.0Gi → {proposed}.0Gi") and "us-1" in message
        assert result.proposals[0].branch == review_branch(model), "one branch per model, whichever cluster writes"


def test_an_elastic_model_the_api_server_would_refuse_is_not_rendered_and_keeps_its_last_objects(regions):
    _land(regions, run_pass(read_repo(regions, cluster="staging")))
    chat = (regions / "models/llm/chat.yaml").read_text().replace(
        "  name: chat-small\n", "  name: chat-small\n  labels: {\"team/a/b\": x}\n", 1)
    _write(regions, "models/llm/chat.yaml", chat)
    output = run_pass(read_repo(regions, cluster="staging"))
    [error] = [e for e in output.errors if e.object == "llm/chat-small"]
    assert error.reason == "InvalidLabel" and "ElasticModel object" in error.message
    assert "rendered/staging/llm/elasticmodel-chat-small.yaml" in output.keep, "its last objects stay"
    assert "rendered/staging/llm/elasticmodel-summarizer.yaml" in output.files, "the others render"


# ---------------------------------------------------------------- node pools: one cluster's own

STAGING_POOL = """apiVersion: gpushare.dev/v1alpha1
kind: GPUInventory
labels: {env: staging}
pricePerGpuHour: {NVIDIA-L4: 0.8}
nodes: []
pools:
  - name: l4
    product: NVIDIA-L4
    gpusPerNode: 1
    hostMemory: 24Gi
    minNodes: 0
    maxNodes: 4
    selector: {karpenter.sh/nodepool: l4}
"""


def test_a_pool_in_one_clusters_inventory_opens_nodes_there_alone(regions, capsys):
    _write(regions, "clusters/staging/gpus.yaml", STAGING_POOL)
    staging = run_pass(read_repo(regions, cluster="staging"))
    assert staging.errors == ()
    slots = {d.name: d.slot for d in staging.plan.decisions}
    assert slots and all(slot.startswith("pool-l4-") for slot in slots.values()), slots
    workers = [p for p in staging.files if p.startswith("rendered/staging/") and "/deployment-worker-pool-l4-" in p]
    assert workers, "the pool node's worker, in staging's own tree"
    assert "karpenter.sh/nodepool" in staging.files[workers[0]].decode()
    for cluster in ("eu-1", "us-1"):  # their inventories have no pool: nothing of staging's reaches them
        other = run_pass(read_repo(regions, cluster=cluster))
        assert not any(d.slot and d.slot.startswith("pool-") for d in other.plan.decisions), cluster
        assert read_repo(regions, cluster=cluster).pools == ()
    assert main(["plan", str(regions), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in doc["clusters"]["staging"]["capacity"]["pools"]] == ["l4"]
    assert doc["clusters"]["eu-1"]["capacity"]["pools"] == []
    assert [(p["cluster"], p["name"]) for p in doc["capacity"]["pools"]] == [("staging", "l4")]
    assert main(["validate", str(regions)]) == 0
    assert "1 node pool(s)" in capsys.readouterr().out
    assert main(["consolidate", str(regions), "--cluster", "staging"]) == 0
    assert "nothing to give back" in capsys.readouterr().out
    assert main(["consolidate", str(regions)]) == 2, "which cluster's pool nodes: it says so"
    assert "--cluster" in capsys.readouterr().err
