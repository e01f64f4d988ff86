"""contract.precision: the one rule a device runs a weight dtype by, the names, and pre-quantized checkpoints.

The profiler Job and the worker both load through `choose`; the last tests fake a Tesla-T4's compute
capability on both sides and check that they pick the same precision and count the same bytes.
"""
from __future__ import annotations

import pytest

from contract.gpu_catalog import CATALOG, capability_of
from contract.precision import (Precision, UnsupportedPrecision, canonical, checkpoint_quantization, choose,
                                product_problem)

T4, L4, H200, CPU = (7, 5), (8, 9), (9, 0), None


@pytest.mark.parametrize("case,capability,weights,checkpoint,expected", [
    ("cpu-auto-keeps-the-checkpoint", CPU, "auto", "float32", Precision("float32", "float32")),
    ("cpu-int8-in-the-checkpoint-dtype", CPU, "int8", "float32", Precision("float32", "int8")),
    ("cpu-int4-in-the-checkpoint-dtype", CPU, "int4", "bfloat16", Precision("bfloat16", "int4")),
    ("cpu-runs-bfloat16", CPU, "bf16", "float32", Precision("bfloat16", "bfloat16")),
    ("h200-auto-bfloat16", H200, "auto", "bfloat16", Precision("bfloat16", "bfloat16")),
    ("h200-int4-computes-in-bfloat16", H200, "int4", "float16", Precision("bfloat16", "int4")),
    ("l4-int8-keeps-float16", L4, "int8", "float16", Precision("float16", "int8")),
    ("t4-bfloat16-checkpoint-runs-float16", T4, "auto", "bfloat16", Precision("float16", "float16")),
    ("t4-int8-computes-in-float16", T4, "int8", "bfloat16", Precision("float16", "int8")),
    ("t4-fp16-alias", T4, "fp16", "bfloat16", Precision("float16", "float16")),
    ("t4-float32-checkpoint-stays", T4, "auto", "float32", Precision("float32", "float32")),
])
def test_the_rule(case, capability, weights, checkpoint, expected):
    assert choose(capability, weights, checkpoint) == expected, case


@pytest.mark.parametrize("case,capability,weights,needle", [
    ("t4-has-no-bfloat16", T4, "bfloat16", "bfloat16 needs compute capability 8.0"),
    ("t4-has-no-int4-kernel", T4, "int4", "int4 weights need compute capability 8.0"),
    ("volta-has-no-int4", (7, 0), "int4", "compute capability 7.0"),
])
def test_what_a_gpu_cannot_run_is_refused_with_the_fix(case, capability, weights, needle):
    with pytest.raises(UnsupportedPrecision, match=needle) as caught:
        choose(capability, weights, "bfloat16", "Tesla-T4")
    assert "fix: set spec.weights.dtype" in str(caught.value) and caught.value.reason == "UnsupportedWeightDtype", case


@pytest.mark.parametrize("name,expected", [(None, "auto"), ("auto", "auto"), ("bf16", "bfloat16"),
                                           ("fp16", "float16"), ("half", "float16"), ("int8", "int8")])
def test_names_and_aliases(name, expected):
    assert canonical(name) == expected


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(UnsupportedPrecision, match="int3.*auto, bfloat16, float16, int8, int4"):
        canonical("int3")


def test_the_catalog_half_dtype_is_what_the_rule_chooses_for_a_bfloat16_checkpoint():
    for product, gpu in CATALOG.items():
        assert choose(gpu.compute_capability, "auto", "bfloat16").compute == gpu.half_dtype, product


@pytest.mark.parametrize("product,weights,refused", [
    ("Tesla-T4", "int4", True), ("Tesla-T4", "bfloat16", True), ("Tesla-T4", "int8", False),
    ("NVIDIA-L4", "int4", False), ("NVIDIA-H200", "bfloat16", False), ("NVIDIA-B200", "int4", False),
])
def test_product_problem_uses_the_catalog_and_lets_unknown_products_through(product, weights, refused):
    assert (product_problem(product, capability_of(product), weights) is not None) == refused


@pytest.mark.parametrize("case,config,words", [
    ("gptq", {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}, "gptq 4-bit, group 128"),
    ("awq", {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 64}}, "awq 4-bit, group 64"),
    ("bitsandbytes-8bit", {"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}},
     "bitsandbytes 8-bit"),
    ("compressed-tensors", {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "int"}}}}}, "compressed-tensors 8-bit"),
    ("torchao", {"quantization_config": {"quant_method": "torchao", "quant_type": {
        "default": {"_type": "Int4WeightOnlyConfig"}}}}, "torchao Int4WeightOnlyConfig"),
    ("in-text-config", {"text_config": {"quantization_config": {"quant_method": "fp8"}}}, "fp8"),
    ("float-checkpoint", {"torch_dtype": "bfloat16"}, None),
])
def test_a_pre_quantized_checkpoint_is_recognised_from_its_config(case, config, words):
    assert checkpoint_quantization(config) == words, case
