"""The query_range reader without a Prometheus: the grid, missing points, refused models, and errors."""
from __future__ import annotations

import json
import urllib.parse

import pytest

from controller.rightsizing.prometheus import UsageUnavailable, queries, read_usage


def fake(series_by_field: dict[str, list[dict]]):
    """A fetch answering each query with the series of the field whose PromQL it carries."""
    by_query = {promql: series_by_field.get(field, []) for field, promql in queries(10).items()}
    seen = []

    def fetch(url: str) -> bytes:
        params = dict(urllib.parse.parse_qsl(url.split("?", 1)[1]))
        seen.append(params)
        return json.dumps({"status": "success", "data": {"resultType": "matrix",
                                                          "result": by_query[params["query"]]}}).encode()
    return fetch, seen


def series(model: str, points: dict[int, float], namespace: str = "llm") -> dict:
    return {"metric": {"model": model, "namespace": namespace}, "values": [[t, str(v)] for t, v in points.items()]}


def test_points_become_samples_on_the_grid_and_gaps_become_missing_data():
    fetch, seen = fake({
        "deviceBytes": [series("chat", {1000: 5e8, 1010: 5e8, 1030: 6e8})],
        "kvUsedBytes": [series("chat", {1000: 1e7, 1030: 2e7})],
        "ttftSeconds": [series("chat", {1030: 0.25})],
    })
    samples = read_usage("http://prom:9090/", 1003, 1047, 10, fetch)
    assert [(s.time, s.model, s.device_bytes) for s in samples] == [
        (1000.0, "llm/chat", 500_000_000), (1010.0, "llm/chat", 500_000_000), (1020.0, "llm/chat", None),
        (1030.0, "llm/chat", 600_000_000)]
    assert samples[2].missing and samples[3].ttft_s == 0.25 and samples[3].kv_used_bytes == 20_000_000
    assert {p["start"] for p in seen} == {"1000.000"} and {p["step"] for p in seen} == {"10"}
    assert all("gpushare_worker_verdict" in p["query"] for p in seen)  # the namespace comes from the verdict


def test_a_refused_model_is_data_with_nothing_on_the_device():
    fetch, _ = fake({"refusals": [series("big", {1000: 1})], "missingBytes": [series("big", {1000: 3e9})]})
    (sample,) = read_usage("http://prom:9090", 1000, 1010, 10, fetch)
    assert (sample.model, sample.device_bytes, sample.refusals, sample.missing_bytes) == ("llm/big", 0, 1, 3_000_000_000)


@pytest.mark.parametrize("answer,needle", [
    (b"<html>oops</html>", "not JSON"),
    (json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode(), "bad_data"),
], ids=["not-json", "query-error"])
def test_bad_answers_are_usage_unavailable(answer, needle):
    with pytest.raises(UsageUnavailable, match=needle):
        read_usage("http://prom:9090", 0, 100, 10, lambda url: answer)


def test_an_out_of_memory_increase_is_an_event():
    fetch, _ = fake({"deviceBytes": [series("chat", {1000: 5e8})], "ooms": [series("chat", {1000: 0.8})]})
    (sample,) = read_usage("http://prom:9090", 1000, 1010, 10, fetch)
    assert sample.ooms == 1


def test_a_window_longer_than_prometheus_answers_at_once_is_read_in_pieces():
    """2 days at 15 s are 11,520 points: Prometheus refuses more than 11,000 per series in one query."""
    asked = []

    def fetch(url: str) -> bytes:
        params = dict(urllib.parse.parse_qsl(url.split("?", 1)[1]))
        start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
        if (end - start) / step + 1 > 11_000:
            return json.dumps({"status": "error", "errorType": "bad_data",
                               "error": "exceeded maximum resolution of 11,000 points per timeseries"}).encode()
        asked.append((start, end))
        points = {int(t): 5e8 for t in range(int(start), int(end) + 1, int(step))} if "device_bytes" in params["query"] else {}
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result":
                           [series("chat", points)] if points else []}}).encode()

    samples = read_usage("http://prom:9090", 0, 2 * 86400, 15, fetch)
    assert len(samples) == 2 * 86400 // 15 and not any(s.missing for s in samples)
    device = sorted(a for a in asked if a[0] in (0.0, 150_000.0))
    assert device[0] == (0.0, 149_985.0) and device[-1][0] == 150_000.0  # back to back, nothing read twice
