"""The passes: one reconcile pass as a pure function (reconcile), and cluster mode's pure half.

inputs → plan → compose → the generated files, the commit message and what to
report. No I/O: the shells (controller.cli) read through the adapters and publish.
"""
