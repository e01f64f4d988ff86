"""A token reaches the git server, and nowhere else: not argv, env, logs or errors (gitops.credentials, git)."""
from __future__ import annotations

import base64
import logging
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gitops import Credentials, WorkingCopy
from gitops.errors import GitAuthFailed

pytestmark = pytest.mark.integration
TOKEN = "ghp_s3cr3tT0kenValue"


class RefusingGitHost(BaseHTTPRequestHandler):
    """Asks for Basic credentials, records what it got, refuses them (a revoked token)."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        self.seen.append(self.headers.get("Authorization", ""))
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="git"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def refusing_host():
    RefusingGitHost.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), RefusingGitHost)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/fleet.git"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_refused_token_is_a_typed_error_that_never_shows_the_token(refusing_host, tmp_path, monkeypatch, caplog):
    token_file = tmp_path / "secret" / "token"
    token_file.parent.mkdir()
    token_file.write_text(TOKEN + "\n")
    launched = []
    real_popen = subprocess.Popen

    def recording_popen(argv, **kwargs):
        launched.append((list(argv), dict(kwargs["env"])))
        return real_popen(argv, **kwargs)

    monkeypatch.setattr("gitops.git.subprocess.Popen", recording_popen)
    caplog.set_level(logging.DEBUG, logger="gpushare.gitops")
    wc = WorkingCopy(refusing_host, "main", tmp_path / "wc", credentials=Credentials(token_file=token_file))

    with pytest.raises(GitAuthFailed) as caught:
        wc.sync()

    expected = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert expected in RefusingGitHost.seen, "the token was sent to the server through askpass"
    assert caught.value.reason == "GitAuthFailed" and "Authentication failed" in caught.value.message
    for text in (str(caught.value), repr(caught.value), caplog.text):
        assert TOKEN not in text
    for argv, env in launched:
        assert not any(TOKEN in arg for arg in argv)
        assert not any(TOKEN in value for value in env.values())
    assert TOKEN not in (wc.root / ".git" / "config").read_text()
    assert TOKEN not in (wc.root / ".git" / "gpushare-askpass").read_text()
