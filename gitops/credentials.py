"""Credentials for the git remote, and redaction of anything secret in text.

Owns how a token or SSH key reaches git without ever sitting in argv, in a URL,
in the environment or in a message: the token stays in its file (e.g. a mounted
Secret) and a small askpass script, which holds no secret, `cat`s it when git
asks; the SSH key is passed by path through GIT_SSH_COMMAND. `redact` scrubs URL
userinfo and the token's value from any text before it is logged or raised.
Called by gitops.git (environment, redaction) and gitops.workcopy (askpass
install, URL checks).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from gitops.errors import GitAuthFailed

# scheme://userinfo@host -> scheme://***@host (userinfo cannot contain "/").
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")
_ASKPASS = """#!/bin/sh
# Written by gpushare: answers git's credential prompts. Holds no secret; reads the token file.
case "$1" in
  Username*) printf '%s\\n' "$GPUSHARE_GIT_USERNAME" ;;
  *) head -n 1 "$GPUSHARE_GIT_TOKEN_FILE" | tr -d '\\r' ;;
esac
"""
ASKPASS_NAME = "gpushare-askpass"


@dataclass(frozen=True)
class Credentials:
    """An HTTPS token file (with the username to send) and/or an SSH private key file.

    `username` defaults to `x-access-token`, which GitHub accepts for every token
    kind and GitLab for personal access tokens; set it for servers that want a
    specific one (Bitbucket: `x-token-auth`).
    """

    token_file: Path | None = None
    username: str = "x-access-token"
    ssh_key_file: Path | None = None
    known_hosts_file: Path | None = None

    def check(self) -> None:
        """Fail early, naming the path, when a credential file cannot be read."""
        for label, path in (("token", self.token_file), ("SSH key", self.ssh_key_file),
                            ("known_hosts", self.known_hosts_file)):
            if path is not None and not Path(path).is_file():
                raise GitAuthFailed(
                    f"the {label} file {path} does not exist or is not a file",
                    "mount the Secret that holds it at that path, or pass the right path",
                )

    def secrets(self) -> tuple[str, ...]:
        """Values that must never appear in a message: the token, read now (a mounted Secret rotates)."""
        if self.token_file is None or not Path(self.token_file).is_file():
            return ()
        token = Path(self.token_file).read_text(encoding="utf-8", errors="replace").strip()
        return (token,) if token else ()

    def env(self, askpass: Path) -> dict[str, str]:
        """Environment for git: askpass for the token, an ssh command for the key."""
        env: dict[str, str] = {}
        if self.token_file is not None:
            env["GIT_ASKPASS"] = str(askpass)
            env["GPUSHARE_GIT_TOKEN_FILE"] = str(Path(self.token_file).resolve())
            env["GPUSHARE_GIT_USERNAME"] = self.username
        if self.ssh_key_file is not None:
            command = ["ssh", "-F", "/dev/null", "-i", str(Path(self.ssh_key_file).resolve()),
                       "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                       "-o", "StrictHostKeyChecking=yes"]
            if self.known_hosts_file is not None:
                command += ["-o", f"UserKnownHostsFile={Path(self.known_hosts_file).resolve()}"]
            env["GIT_SSH_COMMAND"] = shlex.join(command)
        return env


def install_askpass(git_dir: Path) -> Path:
    """Write the askpass script (no secret inside) into the .git directory, owner-only."""
    path = git_dir / ASKPASS_NAME
    path.write_text(_ASKPASS, encoding="utf-8")
    path.chmod(0o700)
    return path


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """`text` with URL userinfo replaced by `***` and every secret value removed."""
    text = _URL_USERINFO.sub(r"\1***@", text)
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
