"""The worker config: the documented example is valid, defaults apply, and each schema violation
is a ConfigError that names the field; `python -m worker` exits 2 on a bad config."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from worker.config import load_config, parse_config
from worker.errors import ConfigError
from worker_support import REPO_ROOT, config_document, model_entry

DOC = REPO_ROOT / "docs" / "worker.md"


def documented_example() -> dict:
    """The first YAML block under '## Configuration' in docs/worker.md."""
    text = DOC.read_text()
    match = re.search(r"## Configuration.*?```yaml\n(.*?)```", text, re.S)
    assert match, "docs/worker.md lost its configuration example"
    return yaml.safe_load(match.group(1))


def test_documented_example_is_valid():
    config = parse_config(documented_example(), source="docs/worker.md")
    assert {m.mode for m in config.models} == {"resident", "swap", "elastic"}


def test_defaults_apply_when_server_and_device_are_omitted():
    doc = config_document([model_entry("a", "/m", "resident")])
    del doc["server"], doc["device"]
    config = parse_config(doc)
    assert (config.device, config.max_queued_requests, config.min_residency_ms, config.verdicts) == (
        "auto", 64, 2000, None)


@pytest.mark.parametrize("case,mutate,reason,field", [
    ("mode-is-not-a-mode", lambda d: d["models"][0].update(mode="fast"), "InvalidConfig", "models/0/mode"),
    ("budget-missing", lambda d: d["models"][0].pop("budgetBytes"), "InvalidConfig", "models/0"),
    ("capacity-zero", lambda d: d["slot"].update(capacityBytes=0), "InvalidConfig", "slot/capacityBytes"),
    ("unknown-field", lambda d: d.update(extra=1), "InvalidConfig", "(document)"),
    ("duplicate-name", lambda d: d["models"].append(dict(d["models"][0])), "DuplicateModelName", "models"),
])
def test_invalid_configs_are_refused_naming_the_field(case, mutate, reason, field):
    doc = config_document([model_entry("a", "/m", "resident")])
    mutate(doc)
    with pytest.raises(ConfigError) as error:
        parse_config(doc, source="w.yaml")
    assert error.value.reason == reason, case
    assert field in error.value.message and error.value.message.startswith("w.yaml"), case


def test_load_config_reads_yaml_and_reports_a_missing_file(tmp_path):
    path = tmp_path / "worker.yaml"
    path.write_text(yaml.safe_dump(config_document([model_entry("a", "/m", "swap")])))
    assert load_config(path).models[0].mode == "swap"
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path / "absent.yaml")
    assert error.value.reason == "ConfigUnreadable"


def test_cli_exits_2_with_the_reason_on_a_bad_config(tmp_path):
    path = tmp_path / "worker.yaml"
    path.write_text("apiVersion: gpushare.dev/v1alpha1\nkind: WorkerConfig\n")
    result = subprocess.run([sys.executable, "-m", "worker", "--config", str(path)], capture_output=True,
                            text=True, timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 2
    assert "InvalidConfig" in result.stderr and "slot" in result.stderr
