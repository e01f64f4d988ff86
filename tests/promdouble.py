"""A Prometheus HTTP API double on 127.0.0.1: `/api/v1/query_range` answers the right-sizing queries.

Owns `PrometheusDouble`: a real HTTP server (threaded) that knows the PromQL of each usage field
(controller.rightsizing.prometheus.queries on the scrape grid, history_queries on the slots) and answers each with a matrix holding a constant value
per model at every grid point asked for, so a controller reads it over HTTP exactly as it reads
Prometheus. It records every query; `stop()` closes it (a Prometheus that went down). Used by the
reconcile loop's right-sizing tests; tests/test_rightsizing_prometheus.py runs the real Prometheus.
"""
from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from controller.rightsizing.prometheus import history_queries, namespaces_query, queries


class PrometheusDouble:
    """`usage`: {"namespace/name": {"deviceBytes": ..., "kvUsedBytes": ..., ...}} (usage-format field names)."""

    def __init__(self, usage: dict[str, dict[str, float]], step_s: int):
        self.usage = usage
        fields = {promql: field for field, promql in (*queries(step_s).items(), *history_queries().items())}
        self.asked: list[dict[str, str]] = []
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                url = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(url.query))
                double.asked.append(params)
                query = params.get("query", "")
                field = fields.get(query) or ("namespaces" if query.startswith(namespaces_query(0)[:50]) else None)
                if url.path != "/api/v1/query_range" or field is None:
                    return self._send(400, {"status": "error", "errorType": "bad_data", "error": "unknown query"})
                start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
                grid = [start + i * step for i in range(int((end - start) // step) + 1)]
                result = [{"metric": {"namespace": ref.split("/")[0], "model": ref.split("/")[1], "instance": "w:9400"},
                           "values": [[t, str(values.get(field, 1))] for t in grid]}
                          for ref, values in sorted(double.usage.items()) if field in values or field == "namespaces"]
                self._send(200, {"status": "success", "data": {"resultType": "matrix", "result": result}})

            def _send(self, code: int, doc: dict) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="prometheus-double", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)

    def __enter__(self) -> PrometheusDouble:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
