"""The shared layer below the controller, the worker and the profiler Job: it imports none of them."""
