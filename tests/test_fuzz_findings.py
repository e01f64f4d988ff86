"""What the fuzzers found, pinned as plain tests: each input once crashed a pass or made the worker answer 500."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from controller.cli.offline import pass_over
from controller.inputs.load import parse_inventory
from worker.errors import InvalidRequest
from worker.protocol import parse_chat, parse_completion

FLEET = Path(__file__).resolve().parent.parent / "examples" / "fleet"


@pytest.mark.parametrize("bias", [
    pytest.param({"--5": 1}, id="two-minus-signs"),
    pytest.param({"-": 1}, id="a-sign-alone"),
    pytest.param({"٣": 1}, id="a-non-ascii-digit"),
    pytest.param({"1" * 21: 1}, id="21-digits"),
])
def test_a_logit_bias_key_that_is_no_token_id_is_a_400(bias):
    with pytest.raises(InvalidRequest) as refused:
        parse_completion({"model": "m", "prompt": "x", "logit_bias": bias})
    assert refused.value.param == "logit_bias"


def test_tool_call_arguments_nested_too_deep_are_handed_back_as_text():
    deep = "[" * 100_000
    parsed = parse_chat({"model": "m", "messages": [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                               "function": {"name": "f", "arguments": deep}}]}]})
    assert parsed.messages[0]["tool_calls"][0]["function"]["arguments"] == deep


@pytest.mark.parametrize("count, slots", [
    pytest.param(1.0, 1, id="one-point-zero-is-one-gpu"),
    pytest.param(2e0, 2, id="an-exponent-is-two-gpus"),
])
def test_a_whole_float_gpu_count_is_that_many_gpus(count, slots):
    doc = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GPUInventory",
           "nodes": [{"name": "n", "product": "NVIDIA-L4", "memory": "23034Mi", "count": count}]}
    found, errors = parse_inventory(doc, "gpus.yaml")
    assert errors == [] and [s.index for s in found] == list(range(slots))


@pytest.mark.parametrize("text", [pytest.param("", id="empty"), pytest.param("# nothing yet\n", id="comments-only")])
def test_an_empty_inventory_is_an_error_and_its_last_good_copy_is_read(text, tmp_path):
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    first = pass_over(root, processes=1)
    for path, data in first.files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    (root / "gpus.yaml").write_text(text)

    second = pass_over(root, processes=1)

    assert [(e.file, e.reason) for e in second.inputs.errors] == [("gpus.yaml", "EmptyInventory")]
    assert second.held == ("gpus.yaml",) and second.inputs.slots == first.inputs.slots


def test_a_number_beyond_64_bits_does_not_hide_another_nodes_error():
    """A number error once returned before the schema ran: the node beside it, never checked, crashed the pass."""
    node = {"product": "NVIDIA-L4", "memory": "23034Mi"}
    doc = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GPUInventory",
           "nodes": [{**node, "name": "a", "count": 2**70}, {**node, "name": "b", "count": None},
                     {**node, "name": "c", "count": 1}]}
    found, errors = parse_inventory(doc, "gpus.yaml")
    assert [(e.path, e.reason) for e in errors] == [("nodes[0].count", "InvalidNumber"), ("nodes[1].count", "InvalidType")]
    assert [s.node for s in found] == ["c"]
