"""Cluster mode (`gpushare reconcile --kube`): the same pass, with facts from the Kubernetes API.

(run_cluster is being written.)
"""
from __future__ import annotations

from pathlib import Path


def add_cluster_arguments(parser) -> None:
    group = parser.add_argument_group("cluster mode (--kube)")
    group.add_argument("--kubeconfig", type=Path, help="default: in-cluster config, else ~/.kube/config")
    group.add_argument("--argocd-application", action="append", default=[], metavar="NAMESPACE/NAME",
                       help="the Argo CD Application that syncs the rendered tree (repeatable; "
                            "default argocd/gpushare-rendered)")
    group.add_argument("--lease-namespace", default="gpushare-system", help="where the leader-election Lease lives")
    group.add_argument("--identity", help="this replica's holder identity (default: the pod's hostname)")
    group.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics, /healthz and /readyz")
