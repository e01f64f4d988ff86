"""The profiler never takes more GPU memory than it is given: beside running workers, the rendered Job passes
--max-gpu-memory-mib (what the plan leaves free on that GPU), and the run caps torch's allocator at the smaller
of that and what the driver reports free, so an overrun is this process's out-of-memory, never a worker's."""
from __future__ import annotations

import pytest

from profiler_job.args import parse_args
from profiler_job.errors import InvalidArguments
from profiler_job.run import memory_fraction

GIB = 1 << 30


@pytest.mark.parametrize("max_bytes, free, total, expected", [
    pytest.param(None, 60 * GIB, 80 * GIB, 0.75, id="whole-gpu-bounded-by-free"),
    pytest.param(20 * GIB, 60 * GIB, 80 * GIB, 0.25, id="beside-bounded-by-the-plan"),
    pytest.param(40 * GIB, 10 * GIB, 80 * GIB, 0.125, id="plan-larger-than-free-driver-wins"),
    pytest.param(0, 60 * GIB, 80 * GIB, 0.0, id="nothing-left-nothing-taken"),
])
def test_memory_fraction(max_bytes, free, total, expected):
    assert memory_fraction(max_bytes, free, total) == pytest.approx(expected)


def test_the_flag_reads_mib():
    assert parse_args(["--model", "m", "--out", "file:p", "--max-gpu-memory-mib", "2048"]).max_gpu_memory_bytes == 2 * GIB
    assert parse_args(["--model", "m", "--out", "file:p"]).max_gpu_memory_bytes is None
    with pytest.raises(InvalidArguments):
        parse_args(["--model", "m", "--out", "file:p", "--max-gpu-memory-mib", "-1"])


@pytest.mark.gpu
def test_on_a_gpu_an_allocation_past_the_cap_fails_in_this_process():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    from profiler_job.run import _limit_device_memory

    fraction = _limit_device_memory(256 << 20)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        assert 0 < fraction <= (256 << 20) / torch.cuda.mem_get_info()[1] + 1e-9
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
