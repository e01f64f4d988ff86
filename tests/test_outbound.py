"""The one outbound client (gitops.outbound) against a hostile remote: each class of bad answer, a typed error.

Every case sends a credential, so each also proves the credential never reaches a message, a repr or
another host.
"""
from __future__ import annotations

import traceback

import pytest

from gitops.outbound import Secret, OutboundError, address, answer_json, request
from tests.remotedouble import HostileRemote

TOKEN = "tok-SECRET-4242"
PASSWORD = "pw-SECRET-9393"


@pytest.fixture(scope="module")
def remote():
    with HostileRemote() as one:
        yield one


@pytest.fixture(scope="module")
def other():
    with HostileRemote() as one:
        yield one


def _call(url: str, **kw):
    return request("GET", url, what="the test API", headers={"Authorization": Secret(f"Bearer {TOKEN}")},
                   **{"deadline_s": 1.0, "max_bytes": 64 << 10, **kw})


def _failure(url: str, **kw) -> OutboundError:
    with pytest.raises(OutboundError) as caught:
        _call(url, **kw)
    exc = caught.value
    rendered = "".join(traceback.format_exception(exc)) + repr(exc) + exc.detail
    assert TOKEN not in rendered and PASSWORD not in rendered
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)
    return exc


CLASSES = [  # (id, path, reason)
    ("slow-body-drip-fed", "/slow-body", "RemoteTimeout"),
    ("slow-status-line", "/slow-headers", "RemoteTimeout"),
    ("never-answers", "/silent", "RemoteTimeout"),
    ("body-beyond-limit", "/big", "AnswerTooLarge"),
    ("declared-length-beyond-limit", "/big-declared", "AnswerTooLarge"),
    ("redirect-loop", "/redirect-loop", "RemoteRedirectLoop"),
    ("redirect-to-non-http", "/redirect?to=file:///etc/passwd", "RedirectRefused"),
    ("unknown-path", "/nowhere", "RemoteNotFound"),
]


@pytest.mark.parametrize("case,path,reason", CLASSES, ids=[c[0] for c in CLASSES])
def test_each_hostile_class_is_a_typed_error(remote, case, path, reason):
    assert _failure(remote.url + path).reason == reason


STATUSES = [s for s in range(400, 600) if s not in (408,)] + [300, 304, 305, 306, 399]


@pytest.mark.parametrize("status", STATUSES)
def test_every_error_status_is_typed_and_its_echo_of_the_request_headers_is_redacted(remote, status):
    exc = _failure(f"{remote.url}/status/{status}")
    expected = ("RemoteAuthFailed" if status in (401, 403) else "RemoteNotFound" if status == 404 else
                "RemoteRateLimited" if status == 429 else "RemoteServerError" if status >= 500 else
                "RemoteRequestRefused" if status >= 400 else "AnswerNotAsDocumented")
    assert exc.reason == expected
    if status >= 400:
        assert exc.status == status and "***" in exc.detail  # the echoed Authorization, redacted


def test_a_redirect_to_another_host_never_carries_the_credential(remote, other):
    exc = _failure(f"{remote.url}/redirect?to={other.url}/json")
    assert exc.reason == "RedirectRefused" and other.url.split("//")[1] in exc.message
    assert not other.seen


def test_a_redirect_without_credentials_is_followed_and_one_on_the_same_host_keeps_them(remote, other):
    answer = request("GET", f"{remote.url}/redirect?to={other.url}/json", what="the test API", deadline_s=2)
    assert answer_json(answer, "the test API") == {"ok": True, "path": "/json"}
    assert answer_json(_call(remote.url + "/redirect-same"), "the test API")["ok"]
    assert remote.seen[-1][0] == "/json" and remote.seen[-1][1]["Authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize("path", ["/garbage", "/html"])
def test_an_answer_that_is_not_json_is_typed_and_quoted_without_control_characters(remote, path):
    with pytest.raises(OutboundError) as caught:
        answer_json(_call(remote.url + path), "the test API")
    assert caught.value.reason == "AnswerNotAsDocumented"
    assert not any(ord(c) < 32 or c == "\x7f" for c in str(caught.value))


@pytest.mark.parametrize("body", [b"NaN", b'{"a": Infinity}', b"[" * 100_000 + b"]" * 100_000, b"\xff"])
def test_json_constants_deep_nesting_and_bad_bytes_are_not_json(body):
    with pytest.raises(OutboundError, match="not JSON"):
        answer_json(body, "the test API")


def test_unreachable_is_typed():
    exc = _failure("http://127.0.0.1:1/json")
    assert exc.reason == "RemoteUnreachable"


def test_url_userinfo_becomes_a_secret_and_never_appears(remote):
    where = address(f"http://user:{PASSWORD}@127.0.0.1:{remote.url.rsplit(':', 1)[1]}/", "the test API")
    assert PASSWORD not in where.url and PASSWORD not in repr(where) and "user" not in where.url
    with pytest.raises(OutboundError) as caught:
        request("GET", where.join("/status/500"), what="the test API", headers=where.credentials, deadline_s=1)
    assert PASSWORD not in str(caught.value) and "user:" not in str(caught.value)
    assert remote.seen[-1][1]["Authorization"].startswith("Basic ")


@pytest.mark.parametrize("url", ["ftp://h/x", "not a url", "http://", "http://h:99999/", f"file://u:{PASSWORD}@x/"])
def test_an_unusable_url_is_typed_and_redacted(url):
    with pytest.raises(OutboundError) as caught:
        address(url, "the test API")
    assert caught.value.reason == "InvalidRemoteUrl" and PASSWORD not in str(caught.value)


def test_a_url_with_userinfo_is_refused_by_request():
    with pytest.raises(OutboundError, match="carries credentials") as caught:
        request("GET", f"http://u:{PASSWORD}@127.0.0.1:1/", what="the test API")
    assert PASSWORD not in str(caught.value)


def test_a_secret_never_prints():
    secret = Secret(TOKEN)
    assert TOKEN not in f"{secret} {secret!r} {secret:>40} {[secret]} {dict(a=secret)}"
    with pytest.raises(TypeError):
        __import__("pickle").dumps(secret)
