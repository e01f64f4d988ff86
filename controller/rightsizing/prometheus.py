"""Usage from Prometheus' HTTP API: the PromQL `query_range` endpoint, turned into usage samples.

Owns the queries over the worker's metrics (docs/worker.md) and the grid they are read
on: one point per `step` seconds for every model seen in the range. A point Prometheus
has no value for (it was down, the worker was not scraped) becomes a sample without
`deviceBytes`, which the recommender treats as missing data. A Prometheus that cannot
be reached or answers an error raises UsageUnavailable. A range longer than Prometheus
answers in one query (11,000 points per series) is read in pieces of MAX_POINTS. Called by
`gpushare usage export` and the controller's right-sizing pass; the HTTP GET is a function
passed in.
"""
from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from array import array
from typing import Callable

from .usage import Sample

Fetch = Callable[[str], bytes]
MAX_POINTS = 10_000  # points per series in one query_range (Prometheus refuses more than 11,000)

# Each model's namespace comes from its verdict series on the same target.
_NS = ("* on(model, instance) group_left(namespace) "
       "max by (model, namespace, instance) (gpushare_worker_verdict)")


def queries(step_s: int) -> dict[str, str]:
    """The PromQL of each usage field; `step_s` is the grid (the scrape interval or a multiple)."""
    rng = f"{2 * step_s}s"  # two grid steps: a scrape that lands just after a grid point still counts
    win = f"{max(4 * step_s, 60)}s"  # rate() needs a few scrapes

    def gauge(metric: str) -> str:
        return f"max by (namespace, model) (max_over_time({metric}[{rng}]) {_NS})"

    def p95(histogram: str) -> str:
        return (f"max by (namespace, model) (histogram_quantile(0.95, sum by (le, model, instance) "
                f"(rate({histogram}_bucket[{win}]))) {_NS})")

    return {
        "deviceBytes": gauge("gpushare_worker_device_bytes"),
        "kvUsedBytes": gauge("gpushare_worker_kv_used_bytes"),
        "kvReservedBytes": gauge("gpushare_worker_kv_reserved_bytes"),
        "queueWaitSeconds": p95("gpushare_worker_queue_wait_seconds"),
        "ttftSeconds": p95("gpushare_worker_ttft_seconds"),
        "tpotSeconds": p95("gpushare_worker_tpot_seconds"),
        "refusals": ('max by (namespace, model) (max_over_time(gpushare_worker_verdict{verdict="refused"}'
                     f'[{rng}]))'),
        "missingBytes": gauge("gpushare_worker_missing_bytes"),
        "budgetBytes": gauge("gpushare_worker_budget_bytes"),
        "ooms": f"max by (namespace, model) (increase(gpushare_worker_out_of_memory_total[{win}]) {_NS})",
    }


class UsageUnavailable(Exception):
    reason = "UsageUnavailable"


def http_get(timeout_s: float = 10.0) -> Fetch:
    def fetch(url: str) -> bytes:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (an http(s) URL we built)
                return response.read()
        except urllib.error.HTTPError as exc:
            raise UsageUnavailable(f"Prometheus answered {exc.code} to {url.split('?')[0]}: "
                                   f"{exc.read(300).decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise UsageUnavailable(f"Prometheus at {url.split('/api/')[0]} is unreachable: "
                                   f"{getattr(exc, 'reason', exc)}; check --prometheus and that it runs") from None
    return fetch


def query_range(base_url: str, query: str, start: float, end: float, step_s: int, fetch: Fetch) -> list[dict]:
    """The `result` of one range query (matrix): [{"metric": {...}, "values": [[t, "v"], ...]}]."""
    params = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step_s})
    body = fetch(f"{base_url.rstrip('/')}/api/v1/query_range?{params}")
    try:
        doc = json.loads(body)
    except json.JSONDecodeError:
        raise UsageUnavailable(f"Prometheus answered something that is not JSON: {body[:200]!r}") from None
    if doc.get("status") != "success":
        raise UsageUnavailable(f"Prometheus refused the query: {doc.get('errorType')}: {doc.get('error')}")
    return doc["data"]["result"]


def read_usage(base_url: str, start: float, end: float, step_s: int, fetch: Fetch | None = None) -> list[Sample]:
    """Samples on the grid start, start + step, ... end for every model any query saw, sorted by time. Each
    field's values are kept in one float array per model over the grid (NaN: no value), so a window of
    hundreds of models costs tens of megabytes before the samples are built."""
    fetch = fetch or http_get()
    grid_start = math.floor(start / step_s) * step_s
    end = math.floor(end / step_s) * step_s - step_s  # the last complete step: scrapes still arrive for `now`
    count = int((end - grid_start) // step_s) + 1 if end >= grid_start else 0
    fields = queries(step_s)
    values: dict[str, dict[str, array]] = {}  # model -> field -> one value per grid point
    pieces = _pieces(grid_start, end, step_s)
    for field, promql in fields.items():
        for a, b in pieces:
            for series in query_range(base_url, promql, a, b, step_s, fetch):
                labels = series.get("metric", {})
                if "namespace" not in labels or "model" not in labels:
                    continue
                ref = f"{labels['namespace']}/{labels['model']}"
                column = values.setdefault(ref, {}).get(field)
                if column is None:
                    column = values[ref][field] = array("d", [math.nan]) * count
                for at, value in series.get("values", []):
                    index = round((float(at) - grid_start) / step_s)
                    number = float(value)
                    if 0 <= index < count and math.isfinite(number):
                        column[index] = number
    samples = []
    models = sorted(values)
    for index in range(count):
        t = float(grid_start + index * step_s)
        for ref in models:
            got = {field: column[index] for field, column in values[ref].items() if not math.isnan(column[index])}
            if got.get("refusals") and "deviceBytes" not in got:
                got["deviceBytes"] = 0.0  # refused: nothing on the device, and that is data
            samples.append(Sample(
                time=t, model=ref,
                device_bytes=_int(got.get("deviceBytes")), kv_used_bytes=_int(got.get("kvUsedBytes")),
                kv_reserved_bytes=_int(got.get("kvReservedBytes")), queue_wait_s=got.get("queueWaitSeconds"),
                ttft_s=got.get("ttftSeconds"), tpot_s=got.get("tpotSeconds"),
                refusals=_int(got.get("refusals")), missing_bytes=_int(got.get("missingBytes")),
                ooms=_ceil(got.get("ooms")), budget_bytes=_int(got.get("budgetBytes"))))
    return samples


def _pieces(start: float, end: float, step_s: int) -> list[tuple[float, float]]:
    """[start, end] on the grid, cut into ranges of at most MAX_POINTS points each."""
    out, at = [], start
    while at <= end:
        out.append((at, min(end, at + (MAX_POINTS - 1) * step_s)))
        at += MAX_POINTS * step_s
    return out


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _ceil(value: float | None) -> int | None:
    """increase() extrapolates (0.8 for one event): any increase is an event."""
    return None if value is None else math.ceil(value - 1e-9)
