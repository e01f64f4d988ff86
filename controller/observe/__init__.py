"""Observing: what the cluster reports (facts) and the ElasticModel status it leads to (status).

Pure: parsers of API objects and the conditions computed from a decision, Argo CD's
sync state and the worker's verdict. The Kubernetes adapter (controller.kube) fetches.
"""
