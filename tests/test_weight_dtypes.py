"""spec.weights.dtype in the controller: validated against the product, planned by the profile of its dtype,
profiled by a Job of its own, shown in plan, explain and status.assigned; and the Tesla-T4 example fleet,
whose int8 Llama 8B is resident where the float16 one can only stream, through `gpushare plan`, `validate`
and `reconcile --offline` against a git daemon."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from contract.estimate import PUBLISHED_CONFIGS, architecture_from_config, estimate_profile
from contract.gpu_catalog import gpu_spec
from controller.cli.commands import main
from controller.inputs.load import parse_model, parse_profile
from controller.passes.measured import measured_path
from controller.planning.plan import plan
from controller.rendering.compose import compose
from controller.types import SLO, ElasticModel, GpuSlot, Inputs, Source
from tests.conftest import REPO_ROOT
from tests.gitserver import git_server  # noqa: F401  (fixture)

T4_FLEET = REPO_ROOT / "examples" / "fleet-t4"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def doc(weights: dict | None, product: str | None = "Tesla-T4") -> dict:
    spec = {"model": LLAMA, "memoryBudget": "12Gi"}
    if weights is not None:
        spec["weights"] = weights
    if product:
        spec["gpu"] = {"product": product}
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
            "metadata": {"name": "m", "namespace": "llm"}, "spec": spec}


@pytest.mark.parametrize("case,weights,product,expected", [
    ("absent-is-auto", None, "Tesla-T4", "auto"),
    ("int8-on-a-t4", {"dtype": "int8"}, "Tesla-T4", "int8"),
    ("fp16-alias", {"dtype": "fp16"}, "Tesla-T4", "float16"),
    ("bf16-alias-on-an-l4", {"dtype": "bf16"}, "NVIDIA-L4", "bfloat16"),
    ("int4-on-an-h200", {"dtype": "int4"}, "NVIDIA-H200", "int4"),
    ("int4-on-a-product-the-catalog-does-not-know", {"dtype": "int4"}, "NVIDIA-B200", "int4"),
    ("int4-without-a-product", {"dtype": "int4"}, None, "int4"),
])
def test_accepted_dtypes_are_canonical(case, weights, product, expected):
    model, errors = parse_model(doc(weights, product), Source("models/m.yaml"))
    assert errors == [] and model.weight_dtype == expected, case


@pytest.mark.parametrize("case,weights,reason,needle", [
    ("unknown-dtype", {"dtype": "int3"}, "InvalidValue", "must be auto or bfloat16"),
    ("int4-on-a-t4", {"dtype": "int4"}, "UnsupportedWeightDtype", "int4 weights need compute capability 8.0"),
    ("bf16-on-a-t4", {"dtype": "bfloat16"}, "UnsupportedWeightDtype", "bfloat16 needs compute capability 8.0"),
    ("unknown-field", {"bits": 4}, "UnknownField", "allowed here: dtype"),
])
def test_validate_refuses_what_the_product_cannot_run(case, weights, reason, needle):
    model, errors = parse_model(doc(weights), Source("models/m.yaml"))
    assert model is None and len(errors) == 1, case
    error = errors[0]
    assert (error.reason, error.object) == (reason, "llm/m") and error.path.startswith("spec.weights")
    assert needle in error.message + error.fix, error


def test_gpushare_validate_names_the_file_the_field_and_the_fix(capsys, tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.yaml").write_text(yaml.safe_dump(doc({"dtype": "int4"})))
    assert main(["validate", str(tmp_path)]) == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert "models/m.yaml" in text and "spec.weights.dtype" in text and "set spec.weights.dtype to int8" in text


def _profile(product: str, weights: str = "auto"):
    arch = architecture_from_config(PUBLISHED_CONFIGS[LLAMA])
    profile, errors = parse_profile(estimate_profile(arch, LLAMA, gpu_spec(product), weights_dtype=weights),
                                    f"profiles/{product}/{weights}.yaml")
    assert errors == []
    return profile


def _model(weights: str, product: str | None = "Tesla-T4", budget: int = 12 << 30) -> ElasticModel:
    return ElasticModel(name="m", namespace="llm", model=LLAMA, budget_bytes=budget, slo=SLO(4096, 1),
                        gpu_product=product, weight_dtype=weights)


T4_SLOT = GpuSlot("t4", 0, "Tesla-T4", 15360 << 20)
L4_SLOT = GpuSlot("l4", 0, "NVIDIA-L4", 23034 << 20)


def test_a_dtype_without_its_profile_waits_for_a_profiler_job_of_its_own():
    """The float16 profile is there; the int8 model still needs its own: pending, and a Job with --weights int8
    whose name and ConfigMap differ from the float one's."""
    models = (_model("int8"), replace(_model("auto"), name="f"))
    result = plan(Inputs(models=models, profiles=(_profile("Tesla-T4"),), slots=(T4_SLOT,)))
    assert [(p.name, p.weight_dtype) for p in result.pending] == [("m", "int8")]
    assert "in int8" in result.pending[0].reason
    files = compose(models, result, (T4_SLOT,)).files
    jobs = {p: yaml.safe_load(t) for p, t in files.items() if "/job-profile-" in p}
    [(path, job)] = jobs.items()
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--weights") + 1] == "int8"
    assert "int8" in path and "int8" in args[args.index("--out") + 1]


def test_the_profile_of_the_dtype_is_the_one_planned():
    profiles = (_profile("Tesla-T4"), _profile("Tesla-T4", "int8"))
    result = plan(Inputs(models=(_model("int8"),), profiles=profiles, slots=(T4_SLOT,)))
    [d] = result.decisions
    assert (d.mode, d.weight_dtype, d.profile) == ("resident", "int8", f"{LLAMA}@Tesla-T4/int8")
    fp16 = plan(Inputs(models=(_model("auto"),), profiles=profiles, slots=(T4_SLOT,))).decisions[0]
    assert fp16.mode != "resident" and fp16.need_bytes > d.need_bytes * 1.5


def test_a_model_without_a_product_is_only_placed_where_its_dtype_runs():
    int4 = _model("int4", product=None, budget=20 << 30)
    profiles = (_profile("NVIDIA-L4", "int4"),)
    [d] = plan(Inputs(models=(int4,), profiles=profiles, slots=(T4_SLOT, L4_SLOT))).decisions
    assert (d.gpu_product, d.mode) == ("NVIDIA-L4", "resident")
    [refused] = plan(Inputs(models=(int4,), profiles=profiles, slots=(T4_SLOT,))).decisions
    assert refused.reason_code == "NoMatchingGPU" and "spec.weights.dtype int4" in refused.reason


def test_a_measured_profile_of_a_dtype_is_filed_beside_the_float_one():
    assert measured_path(_profile("Tesla-T4", "int8")) == (
        "profiles/measured/Tesla-T4/int8/meta-llama--llama-3.1-8b-instruct.yaml")
    assert measured_path(_profile("Tesla-T4")) == "profiles/measured/Tesla-T4/meta-llama--llama-3.1-8b-instruct.yaml"


# ---------------------------------------------------------------- the Tesla-T4 example fleet, through the CLI

def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_the_t4_fleet_plans_the_int8_model_resident_where_float16_only_streams(capsys):
    code, out = run(capsys, "plan", str(T4_FLEET), "-o", "json")
    decisions = {d["name"]: d for d in json.loads(out)["decisions"]}
    assert code == 0
    int8, fp16 = decisions["assistant-8b-int8"], decisions["assistant-8b-fp16"]
    assert (int8["mode"], int8["weightDtype"], int8["profile"]) == ("resident", "int8", f"{LLAMA}@Tesla-T4/int8")
    assert fp16["mode"] == "elastic" and "weightDtype" not in fp16
    t4_usable = (15360 - 1024) << 20
    assert fp16["needBytes"] > t4_usable > int8["needBytes"]  # float16 does not fit a T4 at all; int8 does
    code, out = run(capsys, "plan", str(T4_FLEET))
    assert "meta-llama/Llama-3.1-8B-Instruct (int8)" in out
    assert run(capsys, "validate", str(T4_FLEET))[0] == 0


@pytest.mark.integration
def test_reconcile_offline_renders_the_t4_worker_with_the_int8_entry(capsys, git_server, tmp_path):  # noqa: F811
    files = {p.relative_to(T4_FLEET).as_posix(): p.read_bytes() for p in T4_FLEET.rglob("*") if p.is_file()}
    url = git_server.create_repo("t4", files)
    code, out = run(capsys, "reconcile", "--offline", "--repo", url, "--once", "--workdir", str(tmp_path / "w"))
    assert code == 0 and "committed" in out
    tree = git_server.files("t4")
    config = yaml.safe_load(yaml.safe_load(tree["rendered/gpushare-system/configmap-worker-t4-node-1-gpu0-default.yaml"])
                            ["data"]["worker.yaml"])
    entries = {m["name"]: m for m in config["models"]}
    assert (entries["assistant-8b-int8"]["weightDtype"], entries["assistant-8b-int8"]["dtype"]) == ("int8", "float16")
    assert "weightDtype" not in entries["assistant-8b-fp16"] and entries["assistant-8b-fp16"]["dtype"] == "float16"
    assigned = yaml.safe_load(tree["decisions/llm/assistant-8b-int8.yaml"])["status"]["assigned"]
    assert (assigned["mode"], assigned["weightDtype"]) == ("resident", "int8")
