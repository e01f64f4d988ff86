"""Entry point of the profiler Job container: `python -m profiler_job ...` (see profiler_job.cli)."""
import sys

from profiler_job.cli import main

sys.exit(main())
