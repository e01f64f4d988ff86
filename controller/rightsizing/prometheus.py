"""Usage from Prometheus' HTTP API: the PromQL `query_range` endpoint, turned into usage samples.

Owns the queries over the worker's metrics (docs/worker.md) and the grid they are read
on: one point per `step` seconds for every model seen in the range, each gauge the peak of the
two steps that end there (`max_over_time`: a scrape that lands just after a grid point still
counts). A point Prometheus has no value for
(it was down, the worker was not scraped) becomes a sample without `deviceBytes`, which the
recommender treats as missing data. A pass (`detail_s`) reads the older part of its window as
one peak per slot instead (controller.rightsizing.window.SLOT_S: `max_over_time` over the slot
(T - slot, T] at each slot end T, the peak of the grid points in it), and on the grid only the
last `detail_s` + the fleet's longest `upsizeAfter`, so a breach's clock and a gap in it are read
where they happen (`Usage.history_until` says where the slots end). The slot queries group by model
and worker and take the namespace from one query of the window's verdict series: at 10,000 models
the namespace join at every point cost more than the rest of a slot query. A range longer than Prometheus
answers in one query (11,000 points per series) is read in pieces of MAX_POINTS; for a large
fleet, pieces are shorter still, so that one answer holds about ANSWER_POINTS points across its
series (a parsed answer costs about 200 bytes a point, and QUERY_CONCURRENCY are held at once).

Every answer is untrusted. Each call goes through gitops.outbound (a deadline per query, all
of them within READ_DEADLINE_S, MAX_ANSWER_BYTES, credentials from URL userinfo as a Secret).
A Prometheus that cannot be reached, is too slow, answers an error or anything that is not a
query_range matrix raises UsageUnavailable (with the reason): every model holds. Within a
matrix, a series of the wrong shape holds its model (UsageMalformed), a sample that is
negative, ±Inf, NaN where a gauge must have a value, or beyond the usage format's limits
holds its model (UsageImplausible): such models get no samples, so nothing is acted on and no
memory grows for them. Series of models outside `fleet` are skipped before anything is kept
for them, and counted. Called by `gpushare usage export` and the controller's right-sizing
pass; the HTTP GET is a function passed in.
"""
from __future__ import annotations

import math
import time
import urllib.parse
from array import array
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Collection, Mapping

from gitops.outbound import OutboundError, Secret, address, answer_json, request

from .usage import LIMITS, MAX_USAGE_BYTES, Sample, escape
from .window import SLOT_S

Fetch = Callable[[str, float], bytes]  # (url, seconds left) -> the answer's body
MAX_POINTS = 10_000  # points per series in one query_range (Prometheus refuses more than 11,000)
ANSWER_POINTS = 250_000  # points of one answer across the fleet's series (a fleet of N: pieces of ANSWER_POINTS/N)
QUERY_DEADLINE_S = 30.0  # one query_range call, connect to last byte
READ_DEADLINE_S = 120.0  # every query of one read together: a slow Prometheus costs one pass at most
MAX_ANSWER_BYTES = 256 << 20
QUERY_CONCURRENCY = 2  # queries of one read in flight at once (each within its deadline, all within the read's)
HISTORY_STEP_S = SLOT_S  # the loop reads the window before its detail as one peak per half hour
HISTORY_FIELDS = ("deviceBytes", "kvUsedBytes", "kvUsedLeastBytes")  # what the window's slots are made of
DETAIL_S = 900  # beyond the pass interval and upsizeAfter, how much of the grid a pass reads (a late pass's margin)
_RATES = frozenset({"queueWaitSeconds", "ttftSeconds", "tpotSeconds", "ooms"})  # NaN there: no requests, no value

# Each model's namespace comes from its verdict series on the same target.
_NS = ("* on(model, instance) group_left(namespace) "
       "max by (model, namespace, instance) (gpushare_worker_verdict)")


def _slot_peak(metric: str, seconds: int, least: bool = False) -> str:
    """The peak (`least`: the least value) of a gauge over (t - seconds, t] (a range of whole milliseconds, less
    one: a scrape at a slot's start belongs to the slot before), per model and worker: the namespace comes from
    `namespaces_query` (the join costs more than the rest of the query)."""
    how = "min" if least else "max"
    return f"{how} by (model, instance) ({how}_over_time({metric}[{seconds * 1000 - 1}ms]))"


def namespaces_query(seconds: int) -> str:
    """Each (model, worker)'s namespace over the last `seconds`, from its verdict series."""
    return f"max by (model, namespace, instance) (max_over_time(gpushare_worker_verdict[{seconds}s]))"


_GAUGES = {"deviceBytes": "gpushare_worker_device_bytes", "kvUsedBytes": "gpushare_worker_kv_used_bytes",
           "kvReservedBytes": "gpushare_worker_kv_reserved_bytes", "missingBytes": "gpushare_worker_missing_bytes",
           "budgetBytes": "gpushare_worker_budget_bytes"}


def history_queries(slot_s: int = SLOT_S) -> dict[str, str]:
    """The PromQL of each history field over the slot ending at each point: the peaks, and the least KV in use."""
    return {"deviceBytes": _slot_peak(_GAUGES["deviceBytes"], slot_s),
            "kvUsedBytes": _slot_peak(_GAUGES["kvUsedBytes"], slot_s),
            "kvUsedLeastBytes": _slot_peak(_GAUGES["kvUsedBytes"], slot_s, least=True)}


def queries(step_s: int) -> dict[str, str]:
    """The PromQL of each usage field; `step_s` is the grid (the scrape interval or a multiple), whole seconds."""
    step_s = whole_step(step_s)
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
    """No usage at all this pass; `reason` names why (UsageUnavailable, or the outbound client's reason)."""

    def __init__(self, message: str, reason: str = "UsageUnavailable") -> None:
        super().__init__(message)
        self.reason = reason


class Usage(list):
    """The samples read (a list, sorted by time), with `held`: namespace/name -> (reason, message) for each
    model whose series could not be trusted (it has no samples), and `outside`: how many series were of
    models outside the fleet (skipped)."""

    def __init__(self, samples=(), held: Mapping[str, tuple[str, str]] | None = None, outside: int = 0,
                 step_s: float | None = None, history_until: float | None = None,
                 acts_after: float | None = None) -> None:
        super().__init__(samples)
        self.held = dict(held or {})
        self.outside = outside
        self.step_s = step_s  # the grid
        self.history_until = history_until  # the samples up to it are slot peaks (None: all on the grid)
        self.acts_after = acts_after  # a pass's read: the samples up to it only feed the window (None: a series)


def http_get(credentials: Mapping[str, Secret] | None = None) -> Fetch:
    """A GET through the one outbound client, with the URL's credentials (its userinfo, as a Secret)."""
    def fetch(url: str, deadline_s: float) -> bytes:
        try:
            return request("GET", url, what="Prometheus", headers=credentials, deadline_s=deadline_s,
                           max_bytes=MAX_ANSWER_BYTES).body
        except OutboundError as exc:
            raise UsageUnavailable(f"{exc.message}; check --prometheus and that Prometheus runs ({exc.fix})",
                                   exc.reason) from None
    return fetch


def query_range(base_url: str, query: str, start: float, end: float, step_s: int, fetch: Fetch,
                deadline_s: float = QUERY_DEADLINE_S) -> list:
    """The `result` of one range query, checked to be a matrix: a list of series (each checked by the reader)."""
    params = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step_s})
    body = fetch(f"{base_url.rstrip('/')}/api/v1/query_range?{params}", deadline_s)
    try:
        doc = answer_json(body, "Prometheus")
    except OutboundError as exc:
        raise UsageUnavailable(exc.message, exc.reason) from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        said = doc if not isinstance(doc, dict) else f"{doc.get('errorType')}: {doc.get('error')}"
        raise UsageUnavailable(f"Prometheus refused the query: {escape(str(said)[:200])}", "UsageQueryRefused")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise UsageUnavailable(f"Prometheus answered a {escape(str(kind)[:40])} where query_range documents a matrix; "
                               "check that --prometheus is Prometheus' own API", "AnswerNotAMatrix")
    return data["result"]


def read_usage(base_url: str, start: float, end: float, step_s: int, fetch: Fetch | None = None,
               fleet: Collection[str] | Mapping[str, float] | None = None, deadline_s: float = READ_DEADLINE_S,
               detail_s: float | None = None) -> Usage:
    """Samples for every model of `fleet` (None: every model; a mapping: namespace/name -> its upsizeAfter) any
    query saw, sorted by time. `detail_s` None: the grid start, start + step, ... end for every field. Otherwise
    a pass's read for the window end - start: the detail (the last `detail_s` + the fleet's longest upsizeAfter
    + one step) on that grid, every field (the breaches and changes a pass acts on), and before it a whole window
    the detail's samples are judged against (`Usage.acts_after`): as slots, one peak each of the byte fields
    (max_over_time: what the grid points of a slot hold), from a slot end on; on the grid too when the window is
    shorter than a slot or the detail. So the values a pass reads per model are bounded by window / slot + detail
    / step, not by the scrape rate."""
    try:
        where = address(base_url, "Prometheus")
    except OutboundError as exc:
        raise UsageUnavailable(exc.message, exc.reason) from None
    reader = _Reader(where, fetch or http_get(where.credentials), None if fleet is None else frozenset(fleet),
                     time.monotonic() + deadline_s, deadline_s)
    step_s = whole_step(step_s)
    last = math.floor(end / step_s) * step_s - step_s  # the last complete step: scrapes still arrive for `now`
    window = end - start
    if detail_s is not None:
        longest = max(fleet.values(), default=0) if isinstance(fleet, Mapping) else 0
        detail_s = detail_s + longest + step_s
    if detail_s is None:
        return reader.read([(math.floor(start / step_s) * step_s, last, step_s, queries(step_s))], step_s)
    if window < SLOT_S or detail_s >= window - SLOT_S:
        acts_after = math.floor((last - detail_s) / step_s) * step_s
        grid = (acts_after - math.ceil(window / step_s) * step_s + step_s, last, step_s, queries(step_s))
        return reader.read([grid], step_s, acts_after=acts_after)
    split = math.floor((last - detail_s) / SLOT_S) * SLOT_S
    # a whole window of slots before the detail, and one more: the first slot's end is where usage counts from
    # (Window.covered_for), so every sample the pass acts on sees a window's worth of it, as a replay does
    first = split - math.floor(window / SLOT_S) * SLOT_S
    reader.namespaces = reader.namespaces_at(split, split - first + SLOT_S)
    history = (first, split, SLOT_S, history_queries())
    return reader.read([history, (split + step_s, last, step_s, queries(step_s))], step_s, split, split)


class _Reader:
    """One read: its deadline, its fleet, what it held and skipped, over one or more grids."""

    def __init__(self, where, fetch: Fetch, fleet: frozenset[str] | None, until: float, deadline_s: float):
        self.where, self.fetch, self.fleet, self.until, self.deadline_s = where, fetch, fleet, until, deadline_s
        self.held: dict[str, tuple[str, str]] = {}
        self.outside = 0
        self.namespaces: dict[tuple[str, str], str] = {}  # (model, instance) -> namespace, for series without one

    def namespaces_at(self, at: float, seconds: int) -> dict[tuple[str, str], str]:
        """(model, instance) -> namespace of every verdict series in the `seconds` before `at` (one point)."""
        found = {}
        for series in self._query(namespaces_query(seconds), at, at, SLOT_S):
            labels = series.get("metric") if isinstance(series, dict) else None
            if isinstance(labels, dict) and all(isinstance(labels.get(k), str) and labels.get(k)
                                                for k in ("model", "namespace", "instance")):
                found[(labels["model"], labels["instance"])] = labels["namespace"]
        return found

    def read(self, grids: list[tuple[float, float, int, Mapping[str, str]]], step_s: int,
             history_until: float | None = None, acts_after: float | None = None) -> Usage:
        """Each grid (start, last point, step, field -> PromQL), read in turn; the samples of all, in time order."""
        read = []
        for grid_start, last, grid_step, promql in grids:
            count = int((last - grid_start) // grid_step) + 1 if last >= grid_start else 0
            read.append((self._grid(grid_start, last, grid_step, count, promql), grid_start, grid_step, count))
        samples: list[Sample] = []
        for values, grid_start, grid_step, count in read:
            for ref in self.held:
                values.pop(ref, None)  # held in any grid: none of its samples are kept
            samples += _samples(values, grid_start, grid_step, count)
        return Usage(samples, self.held, self.outside, step_s, history_until, acts_after)

    def _query(self, promql: str, start: float, end: float, step_s: int) -> list:
        left = self.until - time.monotonic()
        if left <= 0:
            raise UsageUnavailable(f"reading usage took longer than {self.deadline_s:g}s; Prometheus is too slow for "
                                   "this window: shorten --rightsize-window or check Prometheus", "RemoteTimeout")
        return query_range(self.where.url, promql, start, end, step_s, self.fetch, min(QUERY_DEADLINE_S, left))

    def _grid(self, grid_start: float, last: float, step_s: int, count: int,
              promql: Mapping[str, str]) -> dict[str, dict[str, array]]:
        """model -> field -> one value per grid point (NaN: none), from one query per field and piece."""
        values: dict[str, dict[str, array]] = {}
        fields = tuple(promql)
        fleet = len(self.fleet) if self.fleet is not None else 1
        per_series = max(1, min(MAX_POINTS, ANSWER_POINTS // max(1, fleet)))  # one answer's size stays bounded
        jobs = [(field, a, b) for field in fields for a, b in _pieces(grid_start, last, step_s, per_series)]
        in_flight: deque = deque()  # at most QUERY_CONCURRENCY answers held at once, taken in order

        def take() -> None:
            field, answer = in_flight.popleft()
            for series in answer.result():  # in order: the first failure is the one raised
                ref = _ref(series, self.namespaces)
                if ref is None:
                    continue  # no model labels: nobody's usage
                if self.fleet is not None and ref not in self.fleet:
                    self.outside += 1
                    continue
                if ref in self.held:
                    continue
                problem = _store(series, field, values.setdefault(ref, {}), grid_start, step_s, count)
                if problem is not None:
                    self.held[ref] = problem
                    values.pop(ref, None)

        with ThreadPoolExecutor(QUERY_CONCURRENCY) as pool:  # Prometheus evaluates them in parallel
            for field, a, b in jobs:
                in_flight.append((field, pool.submit(self._query, promql[field], a, b, step_s)))
                if len(in_flight) >= QUERY_CONCURRENCY:
                    take()
            while in_flight:
                take()
        return values


def _samples(values: dict[str, dict[str, array]], grid_start: float, step_s: int, count: int) -> list[Sample]:
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
                ooms=_ceil(got.get("ooms")), budget_bytes=_int(got.get("budgetBytes")),
                kv_used_least_bytes=_int(got.get("kvUsedLeastBytes"))))
    return samples


def whole_step(step_s: float) -> int:
    """The grid step as PromQL takes it: whole seconds, at least one (a duration flag may carry a fraction)."""
    return max(1, round(step_s))


def _ref(series, namespaces: Mapping[tuple[str, str], str]) -> str | None:
    """namespace/name of a series: its namespace label, else its (model, instance)'s in `namespaces`."""
    labels = series.get("metric") if isinstance(series, dict) else None
    if not isinstance(labels, dict):
        return None
    model = labels.get("model")
    namespace = labels.get("namespace") or namespaces.get((model, labels.get("instance")))
    if not isinstance(namespace, str) or not isinstance(model, str) or not namespace or not model:
        return None
    return f"{namespace}/{model}"


def _store(series: dict, field: str, columns: dict[str, array], grid_start: float, step_s: int,
           count: int) -> tuple[str, str] | None:
    """`series`' values into the model's column for `field`; (reason, message) when the series cannot be
    trusted (the model then holds)."""
    points = series.get("values")
    if not isinstance(points, list):
        return "UsageMalformed", f"Prometheus sent {field} without a list of values"
    column = columns.get(field)
    if column is None:
        column = columns[field] = array("d", [math.nan]) * count
    limit = LIMITS.get(field, MAX_USAGE_BYTES)
    for point in points:
        try:
            at, text = point
            at, number = float(at), float(text)
        except (TypeError, ValueError):
            return "UsageMalformed", f"Prometheus sent a {field} point that is not [time, \"value\"]"
        if not math.isfinite(at):
            return "UsageMalformed", f"Prometheus sent a {field} point at a time that is not finite"
        if math.isnan(number) and field in _RATES:
            continue  # a quantile or increase over no requests
        if not 0 <= number <= limit:  # NaN, ±Inf, negative, absurd
            return "UsageImplausible", (f"Prometheus sent {field} = {escape(str(text)[:40])}, outside [0, {limit:g}]; the "
                                        "model holds until its worker reports plausible values")
        index = round((at - grid_start) / step_s)
        if 0 <= index < count:  # a model on two workers in a point: the peak of both (the least, of the least)
            pick = min if field == "kvUsedLeastBytes" else max
            column[index] = pick(column[index], number) if not math.isnan(column[index]) else number
    return None


def _pieces(start: float, end: float, step_s: int, points: int = MAX_POINTS) -> list[tuple[float, float]]:
    """[start, end] on the grid, cut into ranges of at most `points` points each."""
    out, at = [], start
    while at <= end:
        out.append((at, min(end, at + (points - 1) * step_s)))
        at += points * step_s
    return out


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _ceil(value: float | None) -> int | None:
    """increase() extrapolates (0.8 for one event): any increase is an event."""
    return None if value is None else math.ceil(value - 1e-9)
