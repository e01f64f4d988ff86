"""`python -m profiler_job`: parse flags, profile, publish; on failure an exit code and one termination line.

Owns the process boundary: exit codes (profiler_job.errors), the termination
log, progress output on stderr. Called by profiler_job.__main__; tests call
`main(argv, adapters=...)` in-process.
"""
from __future__ import annotations

import sys
import traceback
from typing import TextIO

from profiler_job.args import parse_args, termination_log_from
from profiler_job.errors import INTERNAL_ERROR_EXIT_CODE, ProfilerError
from profiler_job.progress import Progress
from profiler_job.publish import publish
from profiler_job.run import Adapters, profile_model
from profiler_job.termination import redact, write_termination_line


def main(argv: list[str] | None = None, *, adapters: Adapters | None = None, stderr: TextIO | None = None,
         tty: bool | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    adapters = adapters or Adapters()
    stream = stderr or sys.stderr
    progress = Progress(stream, tty=stream.isatty() if tty is None else tty)
    termination_log = termination_log_from(argv)
    try:
        options = parse_args(argv)
        termination_log = options.termination_log
        profile = profile_model(options, adapters, progress)
        with progress.stage("publish") as log:
            log.update(target=publish(profile, options.out, adapters.core_api), source=profile["source"])
    except ProfilerError as exc:
        progress.failed(exc.reason, write_termination_line(termination_log, exc.line()))
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the process boundary: every failure leaves its line
        stream.write(redact(traceback.format_exc()))
        line = f"Internal: {type(exc).__name__}: {exc}; this is a profiler bug, report it with the model id"
        progress.failed("Internal", write_termination_line(termination_log, line))
        return INTERNAL_ERROR_EXIT_CODE
    progress.close()
    return 0
