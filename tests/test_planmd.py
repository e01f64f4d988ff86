"""PLAN.md a reviewer can trust: one line per GPU with a mark per model and the swap area drawn once, per-GPU tables
whose GPU footprints add up to the usable memory, budget, footprint and profile source columns, a terraform-style
summary line, a Mermaid pie per GPU, and the pinned host RAM per slot."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from controller.rendering.planmd import decision_changes, last_change_lines, plan_markdown, review_summary
from controller.rendering.rollouts import Rollouts
from controller.types import Plan
from tests.compose_scenario import CHAT, DECISIONS, MODELS, PLAN, PREVIOUS, SLOTS

SOURCES = ({(m.model, "NVIDIA-H200", "auto"): "measured" for m in MODELS}
           | {(m.model, "NVIDIA-L4", "auto"): "estimated" for m in MODELS})


@pytest.fixture(scope="module")
def text() -> str:
    return plan_markdown(MODELS, PLAN, SLOTS, decision_changes(PREVIOUS, PLAN), (), None, SOURCES)


def section(text: str, slot: str) -> str:
    return text.split(f"## {slot} ·", 1)[1].split("\n## ", 1)[0]


def gib(cell: str) -> float:
    return float(cell.removesuffix(" usable").removesuffix("Gi"))


@pytest.mark.parametrize("slot", ["node-a/gpu0", "node-b/gpu0", "node-b/gpu1"])
def test_the_gpu_footprints_of_a_slot_add_up_to_its_usable_memory(text, slot):
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section(text, slot).splitlines()
            if line.startswith("| ") and not line.startswith("| bar")]
    footprints = [gib(r[5]) for r in rows if r[5].endswith("Gi") and r[1] != "total"]
    (total,) = [gib(r[5]) for r in rows if r[1] == "total"]
    assert round(sum(footprints), 1) == total  # the swap area once, its members "in the swap area"


def test_the_swap_area_is_drawn_once_for_its_members(text):
    node_a = section(text, "node-a/gpu0")
    assert node_a.count("| in the swap area |") == 2  # coder and summarizer
    assert "| ~ | swap area (llm/coder, llm/summarizer: one at a time) |  |  |  | 19.0Gi |" in node_a
    (line,) = [line for line in text.splitlines() if line.startswith("node-a/gpu0")]
    marks = re.search(r"\|([A-Z~.]+)\|", line).group(1)
    assert len(marks) == 40 and marks.count("~") == round(19 / 140 * 40) and re.fullmatch(r"A+~+\.+", marks)


def test_one_line_per_gpu_and_a_mermaid_pie_per_gpu(text):
    gpu_lines = text.split("## GPUs", 1)[1].split("```", 2)[1].strip().splitlines()
    assert [line.split()[0] for line in gpu_lines] == ["node-a/gpu0", "node-b/gpu0", "node-b/gpu1"]
    pies = re.findall(r"```mermaid\npie showData\n    title (\S+) .*\n((?:    \".*\n)+)```", text)
    assert [slot for slot, _ in pies] == ["node-a/gpu0", "node-b/gpu0", "node-b/gpu1"]
    slices = dict(re.findall(r'"(.+)" : ([0-9.]+)', pies[0][1]))
    assert slices == {"A llm/chat-small": "2.0", "~ swap area": "19.0", ". free": "119.0"}


def test_columns_carry_budget_footprint_and_profile_source(text):
    assert ("| bar | model | mode | budget | need | GPU footprint | layers | profile | TTFT alone / all busy | "
            "TPOT alone / all busy | SLO (on all busy) |") in text
    assert "| A | llm/chat-small | resident | 8.0Gi | 2.0Gi | 2.0Gi | 24/24 | measured |" in text
    assert "| A | research/big-70b | elastic | 20.0Gi | 150.0Gi | 20.0Gi | 9/80 | estimated |" in text


def test_pinned_host_ram_per_slot_and_node_is_shown():
    pinned = [replace(d, host_bytes=(5 << 30) if d.mode == "swap" else 0) for d in DECISIONS]
    text = plan_markdown(MODELS, Plan(decisions=tuple(pinned), pending=PLAN.pending), SLOTS, (), ())
    assert "Host RAM pinned here: 10.0Gi; node node-a: 10.0Gi of unknown (not planned)." in section(text, "node-a/gpu0")


STARTED = "Workers: 0 restart · 0 in place · 3 new (new: w-a, w-b, w-c)."
FIRST = ("5 to add, 0 to change, 0 to remove, 1 refused · 6 models affected · 0 workers restarting, 0 in place, 3 new · "
         "1 profiler Job")


@pytest.mark.parametrize("previous, plan, rollouts, summary, workers", [
    pytest.param({}, PLAN, Rollouts(new=("w-a", "w-b", "w-c")), FIRST, STARTED,
                 id="first-pass-starts-every-worker"),
    pytest.param({d.key: d for d in DECISIONS}, PLAN, Rollouts(), FIRST, STARTED,
                 id="nothing-moved-keeps-the-last-summary-and-workers-line"),
    pytest.param({CHAT.key: replace(DECISIONS[0], mode="swap")} | {d.key: d for d in DECISIONS[1:]}, PLAN,
                 Rollouts(in_place=("w-a",)),
                 "0 to add, 1 to change, 0 to remove, 0 refused · 1 model affected · 0 workers restarting, 1 in place · "
                 "1 profiler Job",
                 "Workers: 0 restart · 1 in place (in place: w-a).", id="a-mode-change-reconfigures-in-place"),
    pytest.param({d.key: d for d in DECISIONS}, Plan(decisions=DECISIONS[1:], pending=PLAN.pending),
                 Rollouts(restart=("w-a",)),
                 "0 to add, 0 to change, 1 to remove, 0 refused · 1 model affected · 1 worker restarting, 0 in place · "
                 "1 profiler Job",
                 "Workers: 1 restart · 0 in place (restart: w-a).", id="a-removal-that-reshapes-its-worker-restarts-it"),
    pytest.param({d.key: d for d in DECISIONS}, Plan(decisions=DECISIONS[1:], pending=PLAN.pending), Rollouts(),
                 "0 to add, 0 to change, 1 to remove, 0 refused · 1 model affected · 0 workers restarting, 0 in place · "
                 "1 profiler Job",
                 None, id="a-change-that-touches-no-worker-drops-the-last-workers-line"),
    pytest.param({CHAT.key: replace(DECISIONS[0], mode="swap")} | {d.key: d for d in DECISIONS[1:]}, PLAN, None,
                 "0 to add, 1 to change, 0 to remove, 0 refused · 1 model affected · workers not compared (no previous "
                 "tree) · 1 profiler Job",
                 None, id="unknown-previous-tree-counts-no-worker"),
])
def test_the_summary_line_counts_like_terraform(previous, plan, rollouts, summary, workers):
    first = plan_markdown(MODELS, PLAN, SLOTS, decision_changes({}, PLAN), (),
                          rollouts=Rollouts(new=("w-a", "w-b", "w-c")))
    text = plan_markdown(MODELS, plan, SLOTS, decision_changes(previous, plan), (), last_change_lines(first),
                         rollouts=rollouts)
    head = text.split("\n## ", 1)[0].splitlines()
    line = next(line for line in head if line.startswith("**Plan:**"))
    assert line.startswith(f"**Plan:** {summary}")
    shown = next((line for line in head if line.startswith("Workers: ")), None)
    assert shown == workers


def test_the_pull_request_body_is_the_summary_and_the_changes(text):
    body = review_summary(text, "0123456789abcdef", "main")
    assert body.startswith("**Plan:** ") and "- llm/chat-small: swap on node-a/gpu0 → resident on node-a/gpu0" in body
    changes = body.split("Latest decision changes:", 1)[1].split("The whole plan", 1)[0].strip().splitlines()
    assert changes and all(line.startswith("- ") for line in changes)  # the summary is not listed as a change
    assert "`rendered/PLAN.md` at 0123456789ab" in body
