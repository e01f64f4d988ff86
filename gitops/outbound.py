"""The one outbound HTTP client: every call the controller makes to a remote (the forge, Prometheus).

Owns the rules every remote call follows, so no caller can forget one:
- a total deadline over connect, status line, headers and body: a watchdog closes the socket
  when it passes, so an answer dripped a byte at a time cannot hold the caller;
- a limit on the answer's size (the declared Content-Length and the bytes actually read);
- redirects: at most MAX_REDIRECTS, never from https to http, and never to another origin
  (scheme, host, port) while the request carries a credential;
- typed errors (`OutboundError`, PascalCase `reason`, what / why / fix), one per class: the remote
  unreachable, too slow, too large, an error status (by class), a refused redirect, an answer
  that is not what the API documents (`answer_json`, and the callers' own shape checks);
- secrets redacted by construction: a credential is a `Secret` (its repr and str are `***`),
  a URL is held as an `Address` without its userinfo (userinfo becomes a Basic `Secret`),
  and an error quotes a remote's body only after every secret value sent and any URL
  userinfo are removed and control characters escaped. Errors are raised `from None`.
Called by gitops.forge (pull requests) and controller.rightsizing.prometheus (usage).
"""
from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Mapping

from gitops.credentials import redact

MAX_REDIRECTS = 3
DEFAULT_DEADLINE_S = 30.0
DEFAULT_MAX_BYTES = 16 << 20
QUOTE_CHARS = 300  # how much of a remote's error body a message quotes
_CHUNK = 64 << 10


class Secret:
    """A credential: only `reveal()` gives the value; repr, str and format print `***`."""

    __slots__ = ("_value", "_forms")

    def __init__(self, value: str, *forms: str) -> None:
        self._value = value
        self._forms = tuple(f for f in (value, value.split(" ", 1)[-1], *forms) if f)

    def reveal(self) -> str:
        return self._value

    def forms(self) -> tuple[str, ...]:
        """Every spelling a remote could echo: the value, the token after its scheme ("Bearer T": T), extras."""
        return self._forms

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return "***"

    def __reduce__(self):
        raise TypeError("a Secret is not pickled")

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo) -> Secret:
        return self


@dataclass(frozen=True)
class Address:
    """A remote's base URL without userinfo; `credentials` holds what the userinfo carried (Basic auth)."""

    url: str
    credentials: Mapping[str, Secret] = field(default_factory=dict, repr=False, compare=False)

    def join(self, path: str) -> str:
        return self.url.rstrip("/") + path


class OutboundError(Exception):
    """A remote call failed; `reason` is PascalCase, `status` the HTTP status when one came, `detail` the
    remote's own words (redacted, escaped, cut to QUOTE_CHARS)."""

    def __init__(self, reason: str, message: str, fix: str, status: int | None = None, detail: str = "") -> None:
        super().__init__(f"{message}. Fix: {fix}")
        self.reason, self.message, self.fix, self.status, self.detail = reason, message, fix, status, detail


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes


def address(url: str, what: str = "remote") -> Address:
    """`url` parsed: http(s) only, with a host; userinfo moved out of the URL into a Basic credential."""
    try:
        parts = urllib.parse.urlsplit(str(url).strip())
        port = parts.port
    except ValueError:
        raise OutboundError("InvalidRemoteUrl", f"the {what} URL {redact(_escape(str(url)))} cannot be parsed",
                            "write it as http(s)://host[:port][/path]") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OutboundError("InvalidRemoteUrl", f"the {what} URL {redact(_escape(str(url)))} is not an http(s) URL "
                            "with a host", "write it as http(s)://host[:port][/path]")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host + (f":{port}" if port is not None else "")
    clean = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), parts.query, ""))
    credentials: dict[str, Secret] = {}
    if parts.username is not None:
        user, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
        pair = f"{user}:{password}"
        credentials["Authorization"] = Secret("Basic " + base64.b64encode(pair.encode()).decode(), pair, password)
    return Address(clean, credentials)


def request(method: str, url: str, *, what: str, headers: Mapping[str, str | Secret] | None = None,
            body: bytes | None = None, deadline_s: float = DEFAULT_DEADLINE_S,
            max_bytes: int = DEFAULT_MAX_BYTES) -> Answer:
    """One call, redirects included, within `deadline_s` in all; a 2xx Answer or an OutboundError.
    `url` must hold no userinfo (build it from an `Address`); `what` names the remote in messages."""
    headers = dict(headers or {})
    secrets = tuple(form for v in headers.values() if isinstance(v, Secret) for form in v.forms())
    end = time.monotonic() + deadline_s
    target = urllib.parse.urlsplit(url)
    if target.username is not None or target.password is not None:
        raise OutboundError("InvalidRemoteUrl", f"the {what} URL carries credentials in it",
                            "give credentials as a Secret, not in the URL (gitops.outbound.address)")
    for _ in range(MAX_REDIRECTS + 1):
        status, answer_headers, data = _once(method, target, headers, body, end, deadline_s, max_bytes, what,
                                             secrets)
        if status not in (301, 302, 303, 307, 308):
            break
        target = _follow(target, answer_headers.get("location"), bool(secrets), what)
        if status == 303 or (status in (301, 302) and method == "POST"):
            method, body = "GET", None
    else:
        raise OutboundError("RemoteRedirectLoop", f"{what} redirected more than {MAX_REDIRECTS} times",
                            f"point the {what} URL at the API itself")
    if not 200 <= status < 300:
        raise _status_error(status, method, target, _quote(data, secrets), what)
    return Answer(status, answer_headers, data)


def answer_json(answer: Answer | bytes, what: str):
    """The JSON document of an answer; AnswerNotJson (typed, quoting a redacted excerpt) when it is not one."""
    data = answer.body if isinstance(answer, Answer) else answer
    try:
        return json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise not_documented(what, f"an answer that is not JSON: {_quote(data, ())!r}") from None


def not_documented(what: str, found: str) -> OutboundError:
    """The typed error for an answer whose shape is not what the remote's API documents."""
    return OutboundError("AnswerNotAsDocumented", f"{what} sent {found}",
                         f"check that the URL points at the {what} API itself (not a proxy or login page)")


# ------------------------------------------------------------------ internals

def _once(method, target, headers, body, end, deadline_s, max_bytes, what, secrets):
    """One exchange; the watchdog shuts the socket at `end`, so nothing blocks past it."""
    remaining = end - time.monotonic()
    if remaining <= 0:
        raise _timeout(what, deadline_s)
    port = target.port or (443 if target.scheme == "https" else 80)
    connection_class = http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(target.hostname, port, timeout=remaining)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        sock = connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(remaining, expire)
    watchdog.daemon = True
    watchdog.start()
    path = urllib.parse.urlunsplit(("", "", target.path or "/", target.query, ""))
    sent = {k: (v.reveal() if isinstance(v, Secret) else v) for k, v in headers.items()}
    sent.setdefault("User-Agent", "gpushare")
    try:
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        declared = response.getheader("Content-Length")
        if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
            raise _too_large(what, max_bytes)
        chunks, size = [], 0
        while True:
            chunk = response.read1(_CHUNK) if hasattr(response, "read1") else response.read(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(what, max_bytes)
            chunks.append(chunk)
            if expired.is_set():
                raise _timeout(what, deadline_s)
        if expired.is_set():
            raise _timeout(what, deadline_s)
        answer_headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, answer_headers, b"".join(chunks)
    except OutboundError:
        raise
    except (OSError, http.client.HTTPException, ssl.SSLError, ValueError) as exc:
        if expired.is_set() or isinstance(exc, (socket.timeout, TimeoutError)):
            raise _timeout(what, deadline_s) from None
        raise OutboundError("RemoteUnreachable", f"{what} at {_origin(target)} is unreachable ({method}): "
                            f"{_escape(redact(str(exc), secrets))[:QUOTE_CHARS]}",
                            f"check the {what} URL and the controller's egress to it") from None
    finally:
        watchdog.cancel()
        connection.close()


def _follow(origin, location: str | None, credentialed: bool, what: str):
    if not location:
        raise not_documented(what, "a redirect without a Location")
    target = urllib.parse.urlsplit(urllib.parse.urljoin(urllib.parse.urlunsplit(origin), location.strip()))
    if target.scheme not in ("http", "https") or not target.hostname or target.username or target.password:
        raise OutboundError("RedirectRefused", f"{what} redirected to a URL that is not plain http(s)",
                            f"point the {what} URL at the API itself")
    if origin.scheme == "https" and target.scheme == "http":
        raise OutboundError("RedirectRefused", f"{what} redirected from https to http ({_origin(target)})",
                            f"point the {what} URL at the API itself")
    if credentialed and _key(target) != _key(origin):
        raise OutboundError("RedirectRefused", f"{what} redirected to another host ({_origin(target)}); the "
                            "credential is not sent there", f"point the {what} URL at {_origin(target)} if "
                            "that host is the API")
    return target


def _key(parts) -> tuple:
    return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def _origin(parts) -> str:
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _status_error(status: int, method: str, target, detail: str, what: str) -> OutboundError:
    said = f"{what} answered {status} to {method} {target.path or '/'}" + (f": {detail}" if detail else "")
    if status in (401, 403):
        return OutboundError("RemoteAuthFailed", said, f"check the credential given for {what} and its scope",
                             status, detail)
    if status == 404:
        return OutboundError("RemoteNotFound", said, f"check the {what} URL", status, detail)
    if status == 429:
        return OutboundError("RemoteRateLimited", said, "the next pass tries again; lower the pass rate if it "
                             "persists", status, detail)
    if 500 <= status < 600:
        return OutboundError("RemoteServerError", said, f"{what} failed on its side; the next pass tries again",
                             status, detail)
    if 400 <= status < 500:
        return OutboundError("RemoteRequestRefused", said, f"see {what}'s message", status, detail)
    return not_documented(what, f"status {status} to {method} {target.path or '/'}")


def _quote(data: bytes, secrets: tuple[str, ...]) -> str:
    """A remote's words fit for a message: decoded, every secret and URL userinfo removed, control characters
    escaped, cut to QUOTE_CHARS."""
    text = data[: QUOTE_CHARS * 8].decode("utf-8", errors="replace")
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return _escape(redact(text)).strip()[:QUOTE_CHARS]


def _escape(text: str) -> str:
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _too_large(what: str, max_bytes: int) -> OutboundError:
    return OutboundError("AnswerTooLarge", f"{what} answered more than {max_bytes} bytes",
                         f"narrow the request (fewer series, a shorter range) or check the {what} URL")


def _timeout(what: str, deadline_s: float) -> OutboundError:
    return OutboundError("RemoteTimeout", f"{what} did not answer in full within {deadline_s:g}s",
                         f"check that {what} is healthy and not overloaded; the next pass tries again")
