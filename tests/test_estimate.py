"""Estimated profiles: the checked-in files are valid, reproducible, and every byte count agrees with the
model transformers actually builds from the same architecture (on the meta device: no memory, no download)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest
import yaml

import schemas
from contract.estimate import (ENGINE_EFFICIENCY, UnsupportedArchitectureError, architecture_from_config, estimate_profile, main,
                                 write_profiles)
from contract.footprint import linear_weight_bytes
from contract.gpu_catalog import UnknownGpuError, gpu_spec
from controller.inputs.load import parse_profile
from tests.tinymodels import config_for

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROFILES = Path(__file__).resolve().parent.parent / "examples" / "fleet" / "profiles"
# Published parameter totals (the safetensors metadata of each repository), independent of config arithmetic.
PUBLISHED_PARAMETERS = {
    "Qwen/Qwen2.5-0.5B-Instruct": 494_032_768,
    "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,
    "Qwen/Qwen2.5-32B-Instruct": 32_763_876_352,
    "meta-llama/Llama-3.1-70B-Instruct": 70_553_706_496,
}
GPUS = {"NVIDIA-H200": "bfloat16", "NVIDIA-L4": "bfloat16", "Tesla-T4": "float16"}
FILES = sorted(p.relative_to(PROFILES).as_posix() for p in PROFILES.rglob("*.yaml"))
FLOAT_FILES = [rel for rel in FILES if rel.count("/") == 1]  # <product>/<model>.yaml: the checkpoint's precision
QUANTIZED_FILES = [rel for rel in FILES if rel.count("/") == 2]  # <product>/<dtype>/<model>.yaml


def _doc(rel: str) -> dict:
    return yaml.safe_load((PROFILES / rel).read_text())


# ---------------------------------------------------------------- transformers, the independent side

def _config(arch: dict):
    """A transformers config of the real class for an architecture block."""
    if arch["family"] == "gpt2":
        return transformers.GPT2Config(
            n_embd=arch["hiddenSize"], n_layer=arch["numHiddenLayers"], n_head=arch["numAttentionHeads"],
            n_inner=arch["intermediateSize"], vocab_size=arch["vocabSize"], n_positions=arch["maxPositionEmbeddings"],
            tie_word_embeddings=arch["tieWordEmbeddings"], bos_token_id=None, eos_token_id=None)
    common = dict(
        hidden_size=arch["hiddenSize"], intermediate_size=arch["intermediateSize"],
        num_hidden_layers=arch["numHiddenLayers"], num_attention_heads=arch["numAttentionHeads"],
        num_key_value_heads=arch["numKeyValueHeads"], head_dim=arch["headDim"], vocab_size=arch["vocabSize"],
        max_position_embeddings=arch["maxPositionEmbeddings"], tie_word_embeddings=arch["tieWordEmbeddings"])
    if arch["family"] == "llama":
        return transformers.LlamaConfig(attention_bias=arch["attentionBias"], **common)
    return transformers.Qwen2Config(**common)


_PARTS = {  # parameter-name prefix -> part of the profile
    "model.embed_tokens.": "embedding", "transformer.wte.": "embedding", "transformer.wpe.": "embedding",
    "model.norm.": "final_norm", "transformer.ln_f.": "final_norm", "lm_head.": "head",
}


def _meta_bytes(config, dtype: str) -> dict:
    """Bytes per part of the model transformers builds from `config`, and the KV cache one token adds."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    parts = {"embedding": 0, "final_norm": 0, "head": 0, "layers": [0] * config.num_hidden_layers}
    for name, param in model.named_parameters():  # a tied head is the embedding: listed once
        size = param.numel() * param.element_size()
        layer = name.removeprefix("model.layers.").removeprefix("transformer.h.")
        if layer != name:
            parts["layers"][int(layer.split(".")[0])] += size
        else:
            parts[next(part for prefix, part in _PARTS.items() if name.startswith(prefix))] += size
    model.config.pad_token_id = None  # else GPT-2 looks for padding in the input: a value meta tensors lack
    with torch.no_grad():
        cache = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device="meta"), use_cache=True).cache
    parts["kv_per_token"] = sum((lay.keys.numel() + lay.values.numel()) * lay.keys.element_size()
                                for lay in cache.layers)
    return parts


def _meta_bytes_of_file(rel: str) -> dict:
    doc = _doc(rel)
    return _meta_bytes_cached(yaml.safe_dump(doc["architecture"]), doc["dtype"])


@lru_cache(maxsize=None)
def _meta_bytes_cached(architecture: str, dtype: str) -> dict:
    return _meta_bytes(_config(yaml.safe_load(architecture)), dtype)


def _profile_bytes(doc: dict) -> dict:
    w = doc["weights"]
    return {"embedding": w["embeddingBytes"], "final_norm": w["finalNormBytes"], "head": w["headBytes"],
            "layers": w["layerBytes"], "kv_per_token": doc["kvCache"]["bytesPerToken"]}


# ---------------------------------------------------------------- the checked-in profiles

def test_checked_in_profiles_are_four_models_on_three_gpus_and_the_8b_quantized_where_the_gpu_runs_it():
    expected = sorted(f"{gpu}/{model.lower().replace('/', '--')}.yaml"
                      for gpu in GPUS for model in PUBLISHED_PARAMETERS)
    assert FLOAT_FILES == expected
    # int8 on every GPU; int4 only from compute capability 8.0 (contract.precision): not on the T4
    assert QUANTIZED_FILES == sorted(f"{gpu}/{dtype}/meta-llama--llama-3.1-8b-instruct.yaml" for gpu in GPUS
                                     for dtype in ("int8", "int4") if (gpu, dtype) != ("Tesla-T4", "int4"))


@pytest.mark.parametrize("rel", FILES)
def test_profile_is_valid_and_loads(rel):
    doc = _doc(rel)
    assert list(schemas.validator("profile").iter_errors(doc)) == []
    profile, errors = parse_profile(doc, rel)
    assert errors == []
    assert (profile.source, profile.dtype, profile.gpu_product) == ("estimated", GPUS[rel.split("/")[0]],
                                                                     rel.split("/")[0])
    assert profile.weight_dtype == (rel.split("/")[1] if rel in QUANTIZED_FILES else "auto")


@pytest.mark.parametrize("rel", QUANTIZED_FILES)
def test_quantized_byte_counts_follow_the_linears_transformers_builds(rel):
    """Each nn.Linear of a decoder layer (as transformers builds it) stored by contract.footprint's rule, every
    other parameter of the layer in the compute dtype; embeddings, norm and head as the float profile."""
    doc, weights = _doc(rel), rel.split("/")[1]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(_config(doc["architecture"]),
                                                              dtype=getattr(torch, doc["dtype"]))
    nbytes = 2
    layer = model.model.layers[0]
    linears = [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 7
    expected = sum(linear_weight_bytes(m.out_features, m.in_features, weights, nbytes) for m in linears) + sum(
        p.numel() * nbytes for name, p in layer.named_parameters() if not name.endswith("proj.weight"))
    assert doc["weights"]["layerBytes"] == [expected] * len(model.model.layers)
    floating = _doc(rel.replace(f"/{weights}/", "/"))
    for part in ("embeddingBytes", "finalNormBytes", "headBytes"):
        assert doc["weights"][part] == floating["weights"][part], part
    ratio = sum(doc["weights"]["layerBytes"]) / sum(floating["weights"]["layerBytes"])
    # int8: 1 of 2 bytes (+ a scale per output channel); int4: 1/2 of 2 bytes + a scale and zero (4 bytes) per 128
    assert ratio == pytest.approx({"int8": 0.5, "int4": 0.25 + 4 / 128 / 2}[weights], rel=0.01)


@pytest.mark.parametrize("rel", FLOAT_FILES)
def test_byte_counts_match_the_model_transformers_builds(rel):
    doc = _doc(rel)
    measured = _meta_bytes_of_file(rel)
    assert _profile_bytes(doc) == measured
    assert doc["weights"]["totalBytes"] == (measured["embedding"] + sum(measured["layers"])
                                            + measured["final_norm"] + measured["head"])
    assert doc["weights"]["tiedEmbeddings"] == (measured["head"] == 0)


@pytest.mark.parametrize("rel", FLOAT_FILES)
def test_total_matches_the_published_parameter_count(rel):
    doc = _doc(rel)
    assert doc["weights"]["totalBytes"] == PUBLISHED_PARAMETERS[doc["model"]] * 2  # 16-bit weights


@pytest.mark.parametrize("rel", FILES)
def test_every_number_has_its_derivation(rel):
    doc = _doc(rel)
    numbers = [f"{section}.{key}" for section in ("weights", "kvCache", "activation", "latency", "gpu")
               for key, value in doc[section].items() if isinstance(value, (int, float, list))
               and not isinstance(value, bool)] + ["runtimeOverheadBytes", "hostToDeviceGBps"]
    assert sorted(set(numbers) - set(doc["derivation"])) == []
    assert doc["architecture"]["source"].endswith(f"{doc['model']}/blob/main/config.json")


@pytest.mark.parametrize("rel", FILES)
def test_latency_follows_the_stated_bounds(rel):
    doc = _doc(rel)
    gpu = gpu_spec(doc["gpu"]["product"])
    seconds_to_read_weights = doc["weights"]["totalBytes"] / (doc["gpu"]["hbmGBps"] * 1e9)
    # the HBM roofline, calibrated by the engine's measured efficiency against it (docs/benchmarks.md)
    assert doc["latency"]["decodeMsPerToken"] == pytest.approx(seconds_to_read_weights * 1e3 / ENGINE_EFFICIENCY,
                                                               abs=1e-4)
    flops = 2 * PUBLISHED_PARAMETERS[doc["model"]] * 1000
    assert doc["latency"]["prefillMsPer1kTokens"] == pytest.approx(
        flops / (gpu.dense_half_tflops * 1e12 * 0.5) * 1e3, abs=1e-4)
    assert doc["hostToDeviceGBps"] == gpu.pinned_h2d_gbps
    assert "HBM bandwidth" in doc["derivation"]["latency.decodeMsPerToken"]


def test_rerunning_the_estimator_reproduces_the_files_byte_for_byte(tmp_path):
    assert main(["--out", str(tmp_path)]) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.yaml"))
    assert written == FILES
    changed = [rel for rel in FILES if (tmp_path / rel).read_bytes() != (PROFILES / rel).read_bytes()]
    assert changed == [], "run: python -m contract.estimate --out examples/fleet/profiles"


def test_the_t4_fleet_profiles_are_the_estimators_t4_files(tmp_path):
    t4 = PROFILES.parent.parent / "fleet-t4" / "profiles"
    assert main(["--out", str(tmp_path), "--product", "Tesla-T4"]) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.yaml"))
    assert written == sorted(p.relative_to(t4).as_posix() for p in t4.rglob("*.yaml"))
    assert written == [rel for rel in FILES if rel.startswith("Tesla-T4/")]
    assert all((tmp_path / rel).read_bytes() == (t4 / rel).read_bytes() for rel in written), \
        "run: python -m contract.estimate --out examples/fleet-t4/profiles --product Tesla-T4"


# ---------------------------------------------------------------- the arithmetic on other shapes

def _llama_with_biases():
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=1, vocab_size=300,
                                    max_position_embeddings=128, attention_bias=True)


SHAPES = [
    ("llama", lambda: config_for("llama")),
    ("llama-tied", lambda: config_for("llama", tied=True)),
    ("llama-attention-bias", _llama_with_biases),
    ("qwen2", lambda: config_for("qwen2")),
    ("qwen2-tied", lambda: config_for("qwen2", tied=True)),
    ("gpt2-tied", lambda: config_for("gpt2", tied=True)),
    ("gpt2-untied", lambda: config_for("gpt2", tied=False)),
]


@pytest.mark.parametrize("make_config", [s[1] for s in SHAPES], ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("gpu,dtype", [("NVIDIA-L4", None), ("Tesla-T4", None), ("NVIDIA-L4", "float32")],
                         ids=["bfloat16", "float16-on-t4", "float32"])
def test_estimate_matches_transformers_for_every_family(make_config, gpu, dtype):
    config = make_config()
    doc = estimate_profile(architecture_from_config(config.to_dict()), "tiny", gpu_spec(gpu), dtype)
    assert list(schemas.validator("profile").iter_errors(doc)) == []
    assert _profile_bytes(doc) == _meta_bytes(config, doc["dtype"])


@pytest.mark.parametrize("config", [{"model_type": "mistral"}, {**config_for("llama").to_dict(), "mlp_bias": True}],
                         ids=["unknown-family", "llama-mlp-bias"])
def test_a_config_it_cannot_count_exactly_is_refused(config):
    with pytest.raises(UnsupportedArchitectureError, match="profiler Job"):
        architecture_from_config(config)


def test_an_unknown_gpu_names_the_known_ones():
    with pytest.raises(UnknownGpuError, match="NVIDIA-H200, NVIDIA-L4, Tesla-T4"):
        gpu_spec("NVIDIA-B200")


def test_write_profiles_creates_one_directory_per_gpu(tmp_path):
    paths = write_profiles(tmp_path / "profiles")
    assert sorted({p.relative_to(tmp_path / "profiles").parts[0] for p in paths}) == sorted(GPUS)
