"""The query_range reader without a Prometheus: the grid, missing points, refused models, and errors."""
from __future__ import annotations

import json
import math
import urllib.parse

import pytest

from controller.rightsizing.prometheus import UsageUnavailable, queries, read_usage


def fake(series_by_field: dict[str, list[dict]]):
    """A fetch answering each query with the series of the field whose PromQL it carries."""
    by_query = {promql: series_by_field.get(field, []) for field, promql in queries(10).items()}
    seen = []

    def fetch(url: str, deadline_s: float = 0) -> bytes:
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
        read_usage("http://prom:9090", 0, 100, 10, lambda url, deadline_s: answer)


def test_an_out_of_memory_increase_is_an_event():
    fetch, _ = fake({"deviceBytes": [series("chat", {1000: 5e8})], "ooms": [series("chat", {1000: 0.8})]})
    (sample,) = read_usage("http://prom:9090", 1000, 1010, 10, fetch)
    assert sample.ooms == 1


def test_a_window_longer_than_prometheus_answers_at_once_is_read_in_pieces():
    """2 days at 15 s are 11,520 points: Prometheus refuses more than 11,000 per series in one query."""
    asked = []

    def fetch(url: str, deadline_s: float = 0) -> bytes:
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


@pytest.mark.parametrize("fleet,points", [
    pytest.param(1, 241, id="one-model-one-piece"), pytest.param(2000, 125, id="2000-models-pieces-of-125"),
    pytest.param(10_000, 25, id="10000-models-pieces-of-25")])
def test_one_answer_holds_a_bounded_number_of_points_whatever_the_fleet(fleet, points):
    """A parsed answer costs about 200 bytes a point: for a large fleet each query covers a shorter range, so
    one answer holds about ANSWER_POINTS points across the fleet's series, and the whole range is still read."""
    from controller.rightsizing.prometheus import ANSWER_POINTS
    asked = []

    def fetch(url: str, deadline_s: float = 0) -> bytes:
        params = dict(urllib.parse.parse_qsl(url.split("?", 1)[1]))
        asked.append((float(params["start"]), float(params["end"]), float(params["step"])))
        return _matrix([])

    read_usage("http://prom:9090", 0, 240 * 60, 60, fetch, fleet={f"team/m-{i}" for i in range(fleet)})
    widths = [round((end - start) / step) + 1 for start, end, step in asked]
    assert max(widths) == min(points, 240) and max(widths) * fleet <= max(ANSWER_POINTS, 240)
    pieces = sorted({(start, end) for start, end, _ in asked})  # the same pieces for every field
    assert pieces[0][0] == 0 and pieces[-1][1] == 239 * 60  # the grid's 240 points, each read once:
    assert all(b[0] == a[1] + 60 for a, b in zip(pieces, pieces[1:]))  # back to back


def _matrix(result) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


NOT_A_MATRIX = [  # (id, body, reason): the whole answer is unusable, every model holds
    ("vector", json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode(),
     "AnswerNotAMatrix"),
    ("scalar", json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}).encode(),
     "AnswerNotAMatrix"),
    ("string-result", json.dumps({"status": "success", "data": {"resultType": "matrix", "result": "x"}}).encode(),
     "AnswerNotAMatrix"),
    ("data-missing", json.dumps({"status": "success"}).encode(), "AnswerNotAMatrix"),
    ("data-a-list", json.dumps({"status": "success", "data": []}).encode(), "AnswerNotAMatrix"),
    ("top-level-list", b"[]", "UsageQueryRefused"),
    ("top-level-null", b"null", "UsageQueryRefused"),
    ("error-with-control-chars", json.dumps({"status": "error", "error": "\x1b[2Jboom"}).encode(), "UsageQueryRefused"),
    ("not-json", b"\x1b[31m<html>", "AnswerNotAsDocumented"),
    ("nan-constant", b"NaN", "AnswerNotAsDocumented"),
    ("deep-nesting", b"[" * 50_000 + b"]" * 50_000, "AnswerNotAsDocumented"),
]


@pytest.mark.parametrize("case,body,reason", NOT_A_MATRIX, ids=[c[0] for c in NOT_A_MATRIX])
def test_an_answer_that_is_not_a_query_range_matrix_makes_usage_unavailable_with_its_reason(case, body, reason):
    with pytest.raises(UsageUnavailable) as caught:
        read_usage("http://prom:9090", 0, 100, 10, lambda url, deadline_s: body)
    assert caught.value.reason == reason
    assert not any(ord(c) < 32 for c in str(caught.value))


def _point_series(model, points):
    return {"metric": {"model": model, "namespace": "llm"}, "values": points}


UNTRUSTED_SERIES = [  # (id, deviceBytes series of the model "bad", reason it holds with)
    ("negative", [[1000, "-5"]], "UsageImplausible"),
    ("nan-gauge", [[1000, "NaN"]], "UsageImplausible"),
    ("inf", [[1000, "+Inf"]], "UsageImplausible"),
    ("minus-inf", [[1000, "-Inf"]], "UsageImplausible"),
    ("absurd", [[1000, "1e300"]], "UsageImplausible"),
    ("beyond-int64", [[1000, str(2 ** 70)]], "UsageImplausible"),
    ("value-not-a-number", [[1000, "lots"]], "UsageMalformed"),
    ("point-not-a-pair", [[1000]], "UsageMalformed"),
    ("point-a-string", ["1000"], "UsageMalformed"),
    ("time-inf", [["Infinity", "5"]], "UsageMalformed"),
    ("values-not-a-list", {"1000": "5"}, "UsageMalformed"),
]


@pytest.mark.parametrize("case,points,reason", UNTRUSTED_SERIES, ids=[c[0] for c in UNTRUSTED_SERIES])
def test_an_untrusted_series_holds_its_model_only_with_a_named_reason(case, points, reason):
    good = _point_series("good", [[1000, "5e8"]])
    answers = {"device_bytes": _matrix([_point_series("bad", points), good])}

    def fetch(url, deadline_s):
        query = dict(urllib.parse.parse_qsl(url.split("?", 1)[1]))["query"]
        return answers["device_bytes"] if "device_bytes" in query else _matrix([])

    usage = read_usage("http://prom:9090", 1000, 1010, 10, fetch)
    assert [(s.model, s.device_bytes) for s in usage] == [("llm/good", 500_000_000)]  # no sample for the bad one
    assert usage.held["llm/bad"][0] == reason and "llm/good" not in usage.held


def test_a_nan_latency_quantile_is_no_value_not_a_hold():
    fetch, _ = fake({"deviceBytes": [series("chat", {1000: 5e8})], "ttftSeconds": [series("chat", {1000: math.nan})]})
    usage = read_usage("http://prom:9090", 1000, 1010, 10, fetch)
    assert not usage.held and usage[0].ttft_s is None


def test_series_of_models_outside_the_fleet_are_skipped_and_counted_and_never_kept():
    stray = [series(f"stray-{i}", {1000: 5e8}) for i in range(500)]
    fetch, _ = fake({"deviceBytes": [series("chat", {1000: 5e8}), *stray], "kvUsedBytes": stray})
    usage = read_usage("http://prom:9090", 1000, 1010, 10, fetch, fleet={"llm/chat"})
    assert {s.model for s in usage} == {"llm/chat"} and usage.outside == 1000 and not usage.held


@pytest.mark.parametrize("case,path,reason", [
    ("slow-body", "/slow-body", "RemoteTimeout"), ("garbage", "/garbage", "AnswerNotAsDocumented"),
    ("redirect-elsewhere", "/redirect", "RedirectRefused"), ("echo-500", "/status/500", "RemoteServerError"),
    ("echo-401", "/status/401", "RemoteAuthFailed"), ("json-not-prometheus", "/json", "UsageQueryRefused"),
])
def test_a_hostile_prometheus_over_http_is_usage_unavailable_and_never_shows_the_password(case, path, reason,
                                                                                          monkeypatch):
    import controller.rightsizing.prometheus as prometheus
    from tests.remotedouble import HostileRemote
    monkeypatch.setattr(prometheus, "QUERY_DEADLINE_S", 0.5)
    with HostileRemote() as remote:
        url = remote.url.replace("http://", "http://me:pw-S3CRET@") + path
        with pytest.raises(UsageUnavailable) as caught:
            read_usage(url, 0, 100, 10)
        assert remote.seen and remote.seen[0][1]["Authorization"].startswith("Basic ")
    assert caught.value.reason == reason and "pw-S3CRET" not in str(caught.value)


def test_every_query_together_stays_within_the_read_deadline():
    calls = []

    def fetch(url, deadline_s):
        calls.append(deadline_s)
        return _matrix([])

    read_usage("http://prom:9090", 0, 100, 10, fetch, deadline_s=5)
    assert calls and all(0 < d <= 5 for d in calls)
    with pytest.raises(UsageUnavailable) as caught:
        read_usage("http://prom:9090", 0, 100, 10, fetch, deadline_s=-1)
    assert caught.value.reason == "RemoteTimeout"


def test_a_pass_reads_the_history_as_half_hour_peaks_and_on_the_scrape_grid_its_detail_and_longest_upsizeAfter():
    """Bounded values per model per pass: a 2-day window at 60 s is 96 slot peaks + the detail, not 2,880. The
    detail covers the pass's margin plus the fleet's longest upsizeAfter (a breach's clock and a gap in it are read
    where they happen), starts at a slot end, and before it come a whole window of slots."""
    from controller.rightsizing.prometheus import HISTORY_FIELDS, HISTORY_STEP_S, history_queries
    asked = []

    def fetch(url, deadline_s):
        params = dict(urllib.parse.parse_qsl(url.split("?", 1)[1]))
        start, end, step = float(params["start"]), float(params["end"]), int(params["step"])
        asked.append((params["query"], start, end, step))
        value = 9e9 if step == HISTORY_STEP_S else 5e8  # a history peak above anything the detail shows
        return _matrix([series("chat", {int(t): value for t in range(int(start), int(end) + 1, step)})]
                       if "device_bytes" in params["query"] else [])

    end = 10 * 86400 + 30
    usage = read_usage("http://prom:9090", end - 2 * 86400, end, 60, fetch, detail_s=1200,
                       fleet={"llm/chat": 1800, "llm/other": 60})  # the longest upsizeAfter: 30 minutes
    history = [s for s in usage if s.time <= usage.history_until]
    detail = [s for s in usage if s.time > usage.history_until]
    assert usage.history_until == usage.acts_after and usage.history_until % HISTORY_STEP_S == 0
    assert usage.history_until <= end - 60 - 1200 - 1800 - 60  # the detail reaches back past the longest upsizeAfter
    assert len(history) == 2 * 86400 // HISTORY_STEP_S + 1 and all(s.device_bytes == 9e9 for s in history)
    assert {s.time % HISTORY_STEP_S for s in history} == {0}  # each at its slot's end
    assert 51 <= len(detail) <= 82 and all(s.device_bytes == 5e8 for s in detail)
    assert [s.time for s in usage] == sorted(s.time for s in usage) and usage.step_s == 60
    (names,) = [(start, end) for q, start, end, _ in asked if q.startswith("max by (model, namespace, instance)")]
    assert names == (usage.history_until, usage.history_until)  # each (model, worker)'s namespace, asked once
    coarse = {q for q, *_, step in asked if step == HISTORY_STEP_S and "gpushare_worker_verdict" not in q}
    assert coarse == set(history_queries().values()) and len(coarse) == len(HISTORY_FIELDS)
    assert all(f"[{HISTORY_STEP_S * 1000 - 1}ms]" in q and "group_left" not in q for q in coarse)  # (T - 30m, T]


def test_a_model_held_by_the_reader_holds_alone_in_the_step_with_the_readers_reason():
    from dataclasses import replace

    from controller.policy import Rightsizing
    from controller.rightsizing.step import step
    from controller.rightsizing.usage import Sample, by_model
    from factories import toy_model

    policy = Rightsizing(policy="Auto", upsize_after_s=60)
    models = [replace(toy_model(name, 4 << 30), rightsizing=policy) for name in ("good", "bad", "zzz")]
    samples = [Sample(time=60.0 * i, model=f"llm/{name}", device_bytes=1 << 30, ooms=int(i == 5))
               for i in range(10) for name in ("good", "zzz")]
    held = {"llm/bad": ("UsageImplausible", "Prometheus sent deviceBytes = -5")}
    result = step(models, (), [], {}, by_model(samples), 600.0, held=held)
    bad = result.records[("llm", "bad")]
    assert [(c.type, c.status, c.reason) for c in bad.conditions] == [("UsageAvailable", "False", "UsageImplausible")]
    assert bad.budget_bytes == 4 << 30
    for name in ("good", "zzz"):  # before and after it in order: both act on their own usage
        assert result.records[("llm", name)].direction == "up"


def test_history_slots_take_their_namespace_from_the_verdict_series_of_their_model_and_worker():
    """The slot queries skip the namespace join (it cost more than the rest of each query at 10,000 models): a slot
    series carries model and instance, and the verdict series of the window name its namespace."""
    from controller.rightsizing.prometheus import HISTORY_STEP_S

    def fetch(url, deadline_s):
        params = dict(urllib.parse.parse_qsl(url.split("?", 1)[1]))
        start, end, step = float(params["start"]), float(params["end"]), int(params["step"])
        points = {int(t): 5e8 for t in range(int(start), int(end) + 1, step)}
        query = params["query"]
        if query.startswith("max by (model, namespace, instance)"):
            return _matrix([{"metric": {"model": "chat", "namespace": ns, "instance": f"w-{ns}:9400"},
                             "values": [[start, "1"]]} for ns in ("team-a", "team-b")])
        if step == HISTORY_STEP_S and "device_bytes" in query:
            return _matrix([{"metric": {"model": "chat", "instance": f"w-{ns}:9400"},
                             "values": [[t, str(v)] for t, v in points.items()]} for ns in ("team-a", "team-b")]
                           + [{"metric": {"model": "chat", "instance": "unknown:9400"}, "values": [[start, "9"]]}])
        return _matrix([series("chat", points, namespace=ns) for ns in ("team-a", "team-b")]
                       if "device_bytes" in query else [])

    end = 10 * 86400
    usage = read_usage("http://prom:9090", end - 86400, end, 60, fetch, detail_s=1200,
                       fleet={"team-a/chat": 60, "team-b/chat": 60})
    history = [s for s in usage if s.time <= usage.history_until]
    assert {s.model for s in history} == {"team-a/chat", "team-b/chat"} and usage.outside == 0
    assert all(s.device_bytes == 5e8 for s in history)  # a worker no verdict names is nobody's
