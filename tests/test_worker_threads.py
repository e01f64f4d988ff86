"""worker/threads.py: the CPUs the worker may use (cgroup v2 and v1 quotas, the affinity mask), the thread rule
and its overrides, and `python -m worker` applying it (its /status reports the count in force)."""
from __future__ import annotations

import httpx
import pytest

from worker.threads import cgroup_cpu_limit, choose_threads, usable_cpus
from worker_support import WorkerProcess, config_document, model_entry, tiny_models  # noqa: F401  (fixture)


def cgroup(tmp_path, files: dict[str, str]):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.mark.parametrize("case,files,proc,affinity,expected", [
    ("no-cgroup-the-affinity-mask", {}, "", {0, 1, 2, 3}, 4),
    ("v2-quota-of-two-cpus", {"cpu.max": "200000 100000\n"}, "0::/\n", set(range(16)), 2),
    ("v2-fractional-quota-rounds-up", {"cpu.max": "150000 100000"}, "0::/\n", set(range(16)), 2),
    ("v2-no-quota", {"cpu.max": "max 100000"}, "0::/\n", set(range(8)), 8),
    ("v2-the-process-own-cgroup", {"kubepods/pod1/cpu.max": "100000 100000", "cpu.max": "max 100000"},
     "0::/kubepods/pod1\n", set(range(8)), 1),
    ("v1-cfs-quota", {"cpu,cpuacct/cpu.cfs_quota_us": "300000", "cpu,cpuacct/cpu.cfs_period_us": "100000"},
     "", set(range(8)), 3),
    ("v1-unlimited", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, "", set(range(6)), 6),
    ("quota-above-the-mask-keeps-the-mask", {"cpu.max": "800000 100000"}, "0::/", {0, 1}, 2),
    ("garbage-is-no-quota", {"cpu.max": "lots"}, "0::/", {0, 1, 2}, 3),
])
def test_usable_cpus(case, files, proc, affinity, expected, tmp_path):
    root = cgroup(tmp_path, files)
    assert usable_cpus(root, proc, affinity)[0] == expected, case


def test_the_reason_names_the_quota_and_its_file(tmp_path):
    root = cgroup(tmp_path, {"cpu.max": "100000 100000"})
    assert cgroup_cpu_limit(root, "0::/") == (1.0, f"cgroup v2 {root / 'cpu.max'}: 100000 100000")
    cpus, why = usable_cpus(root, "0::/", {0, 1, 2, 3})
    assert cpus == 1 and "1 CPUs of quota (cgroup v2" in why and "4 CPUs in the affinity mask" in why
    assert usable_cpus(tmp_path / "absent", "", {0, 1}) == (2, "2 CPUs in the affinity mask")


@pytest.mark.parametrize("case,flag,config,env,expected", [
    ("rule-leaves-one-cpu", None, None, {}, 1),
    ("flag-first", 3, 5, {"OMP_NUM_THREADS": "7"}, 3),
    ("config-next", None, 5, {"OMP_NUM_THREADS": "7"}, 5),
    ("omp-num-threads-next", None, None, {"OMP_NUM_THREADS": "7"}, 7),
    ("empty-omp-is-not-a-choice", None, None, {"OMP_NUM_THREADS": ""}, 1),
])
def test_precedence(case, flag, config, env, expected):
    assert choose_threads(flag, config, env, usable=(2, "2 CPUs")).count == expected, case


@pytest.mark.parametrize("cpus,expected", [(1, 1), (2, 1), (4, 3), (16, 15)])
def test_the_rule_is_one_thread_per_cpu_but_one(cpus, expected):
    threads = choose_threads(None, None, {}, usable=(cpus, f"{cpus} CPUs"))
    assert threads.count == expected and f"{cpus} usable CPUs" in threads.why


@pytest.mark.integration
@pytest.mark.parametrize("case,args,env,config,expected", [
    ("default-settings", (), {"OMP_NUM_THREADS": None}, {}, None),
    ("flag", ("--intra-op-threads", "2"), {"OMP_NUM_THREADS": None}, {}, 2),
    ("worker-config", (), {"OMP_NUM_THREADS": None}, {"intraOpThreads": 3}, 3),
])
def test_python_m_worker_sets_its_threads(case, args, env, config, expected, tiny_models, tmp_path):
    document = config_document([model_entry("m", tiny_models["llama"], "resident")])
    document["server"].update(config)
    if expected is None:
        expected = choose_threads(None, None, {}).count
    with WorkerProcess(tmp_path, document, args=args, env=env) as worker:
        assert httpx.get(f"{worker.base_url}/status", timeout=10).json()["intraOpThreads"] == expected, case
