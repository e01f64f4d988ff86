"""The shells: the `gpushare` command line and the loops around the pure pass.

Top of the controller: argument parsing, the offline and cluster loops (one poll
loop, `loop`), the metrics endpoint, and printing. Nothing below imports it.
"""
