"""A Hugging Face Hub double on 127.0.0.1 for huggingface_hub's own client: no network.

It serves a repository's revision, its file tree and each file (HEAD and GET, with the
X-Repo-Commit and ETag headers the client checks), and refuses as the real Hub does
(status, X-Error-Code, X-Error-Message) for the repositories given a refusal; a repository
it does not know is a 404 RepoNotFound. It records each request with its Authorization
header. Used by the worker's and the profiler's download tests through the `hub` fixture.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import huggingface_hub.constants
import pytest

GATED = "Access to model org/gated is restricted. You must have access to it and be authenticated to access it."
TOKEN = "hf_SecretToken123"
NOT_FOUND = (404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})
REFUSALS = {  # repository -> (status, headers), as the Hub answers
    "org/gated": (403, {"X-Error-Code": "GatedRepo", "X-Error-Message": GATED}),
    "org/gated-401": (401, {"X-Error-Code": "GatedRepo", "X-Error-Message": GATED}),
    "org/moved": (404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id: v9"}),
    "org/flaky": (400, {"X-Error-Message": "Bad request: the Hub is confused"}),
}


@dataclass
class HubState:
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repository -> file name -> bytes
    refusals: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Authorization)

    def serve(self, repo: str, directory: Path) -> None:
        """Serve every file of a saved model directory as `repo`."""
        self.repos[repo] = {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}

    def asked(self, repo: str) -> list[str | None]:
        """The Authorization headers of the requests about `repo`."""
        return [auth for _, path, auth in self.seen if f"/{repo}/" in path]


def _sha(repo: str) -> str:
    return hashlib.sha1(repo.encode()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    state: HubState

    def do_GET(self):  # noqa: N802 - http.server's name
        self._answer(body=True)

    def do_HEAD(self):  # noqa: N802
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.state.seen.append((self.command, path, self.headers.get("Authorization")))
        api = path.startswith("/api/models/")
        rest = path.removeprefix("/api/models/") if api else path.lstrip("/")
        owner, name, *tail = rest.split("/")
        repo = f"{owner}/{name}"
        if repo in self.state.refusals or repo not in self.state.repos:
            status, headers = self.state.refusals.get(repo, NOT_FOUND)
            return self._send(status, headers, b"", body)
        files, sha = self.state.repos[repo], _sha(repo)
        if api and tail[:1] == ["revision"]:
            info = {"id": repo, "sha": sha, "siblings": [{"rfilename": f} for f in files]}
            return self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body)
        if api and tail[:1] == ["tree"]:
            tree = [{"type": "file", "path": f, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for f, data in files.items()]
            return self._send(200, {"Content-Type": "application/json"}, json.dumps(tree).encode(), body)
        if tail[:1] == ["resolve"] and "/".join(tail[2:]) in files:
            data = files["/".join(tail[2:])]
            headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
            return self._send(200, headers, data, body)
        return self._send(*NOT_FOUND, b"", body)

    def _send(self, status: int, headers: dict[str, str], data: bytes, body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, *args):
        pass


def serve_hub(state: HubState) -> tuple[ThreadingHTTPServer, str]:
    """The double serving `state` in a thread, and its endpoint (what HF_ENDPOINT names; the caller shuts it down)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Handler,), {"state": state}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The double, online, with the REFUSALS, the hub cache in tmp_path and HF_TOKEN set (its state returned)."""
    state = HubState(refusals=dict(REFUSALS))
    server, endpoint = serve_hub(state)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    yield state
    server.shutdown()
    server.server_close()
