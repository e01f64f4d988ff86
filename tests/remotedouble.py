"""A hostile remote on 127.0.0.1: one HTTP server that serves every class of bad answer by path.

Owns `HostileRemote`. Paths: `/json` (a good JSON answer), `/garbage` (200, not JSON), `/html` (200, a
login page), `/slow-body` (headers at once, then the body dripped a byte at a time), `/slow-headers`
(the status line dripped), `/silent` (accepts, never answers), `/big` (an answer larger than asked),
`/big-declared` (a Content-Length beyond any limit), `/status/N` (status N, a body that echoes every
request header), `/redirect?to=URL` (302 to URL, by default `elsewhere`, another host), `/redirect-same` (302 to /json), `/redirect-loop`.
Anything after the class's path is ignored (`/garbage/repos/o/r/pulls` is `/garbage`), so a client that
appends its API's paths to a base URL meets the same classes.
It records the headers of every request, so a test can see what reached it. Used by tests/test_outbound.py,
tests/test_forge.py and tests/test_rightsizing_prometheus_units.py.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HostileRemote:
    def __init__(self, drip_s: float = 0.05, elsewhere: str = "http://localhost:1/elsewhere") -> None:
        self.elsewhere = elsewhere  # where `/redirect` without `to` sends: another host
        self.seen: list[tuple[str, dict[str, str]]] = []
        remote = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                self._serve()

            do_POST = do_PATCH = do_PUT = do_GET  # noqa: N815

            def _serve(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                remote.seen.append((url.path, dict(self.headers.items())))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                query = dict(urllib.parse.parse_qsl(url.query))
                parts = url.path.split("/")  # a class is the first segment (status: two), whatever follows it
                path = "/".join(parts[:3] if parts[1:2] == ["status"] else parts[:2])
                if path == "/json":
                    return self._send(200, json.dumps({"ok": True, "path": path}).encode())
                if path == "/garbage":
                    return self._send(200, b"\x00\xffnot json at all\x1b[31m")
                if path == "/html":
                    return self._send(200, b"<html><body>Please log in</body></html>", "text/html")
                if path == "/big":  # no Content-Length: only the bytes read can tell
                    self.send_response(200)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    return self._write(b"[" + b"0," * (1 << 20) + b"0]")
                if path == "/big-declared":
                    self.send_response(200)
                    self.send_header("Content-Length", str(1 << 40))
                    self.end_headers()
                    return self._write(b"{}")
                if path == "/slow-body":
                    body = json.dumps({"ok": True, "pad": "x" * 400}).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    return self._drip(body)
                if path == "/slow-headers":
                    return self._drip(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Pad: " + b"x" * 400 + b"\r\n\r\n{}")
                if path == "/silent":
                    time.sleep(30)
                    return None
                if path.startswith("/status/"):
                    status = int(path.rsplit("/", 1)[1])
                    echo = json.dumps({"message": "refused", "request": {"path": self.path,
                                                                       "headers": dict(self.headers.items())}})
                    return self._send(status, echo.encode())
                if path == "/redirect":
                    return self._redirect(query.get("to", remote.elsewhere))
                if path == "/redirect-same":
                    return self._redirect("/json")
                if path == "/redirect-loop":
                    return self._redirect("/redirect-loop")
                return self._send(404, b'{"message": "no such path"}')

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self._write(body)

            def _write(self, body: bytes) -> None:
                try:
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (a limit or a deadline): that is the point

            def _redirect(self, to: str) -> None:
                self.send_response(302)
                self.send_header("Location", to)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _drip(self, data: bytes) -> None:
                try:
                    for i in range(len(data)):
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                        time.sleep(drip_s)
                except OSError:
                    pass

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="hostile-remote", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HostileRemote:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
