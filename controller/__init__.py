"""gpushare controller: load + validate -> plan -> compose -> status, and the `gpushare` CLI.

The reconcile pass is pure; the adapters (gitops, the cluster client, plain
directories) are passed in by the CLI.
"""
