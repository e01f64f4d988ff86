"""Watching the mounted worker config and applying its changes in place.

A ConfigMap volume changes its file by swapping a symlink, so the watch compares the
file's bytes, every `interval_s`, instead of relying on inotify. A changed file that
does not parse or validate is logged and skipped (the worker keeps serving its last
good config) until the file changes again. Called by `python -m worker`; `check` is
the one step the thread repeats, and what the tests drive.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

from .config import load_config
from .errors import ConfigError
from .reconfigure import ConfigDiff

log = logging.getLogger(__name__)


class ConfigWatch:
    def __init__(self, path: str | Path, worker, *, interval_s: float = 10.0):
        self.path, self.worker, self.interval_s = Path(path), worker, interval_s
        self._seen = self._digest()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="config-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> ConfigDiff | None:
        """Apply the file if it changed since the last check; the diff applied, or None."""
        digest = self._digest()
        if digest is None or digest == self._seen:
            return None
        self._seen = digest
        try:
            config = load_config(self.path)
        except ConfigError as exc:
            log.warning("the changed config is not applied: %s: %s", exc.reason, exc.message)
            return None
        return self.worker.apply(config)

    def _digest(self) -> str | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:  # mid-swap or unmounted: look again next time
            return None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # a bug applying one change must not end the watch
                log.exception("applying the changed config failed")
