"""One way to reach the Kubernetes API: client setup and the ConfigMap write every program shares.

Owns loading credentials (a named kubeconfig, else the in-cluster ServiceAccount,
else ~/.kube/config) into an official `kubernetes` ApiClient, and
`write_configmap`: create a ConfigMap, or merge-patch it when it exists. All
three programs build their client here; the profiler Job (profiles) and the worker
(verdicts) write with it, each mapping failures to its own typed errors. The
client is imported lazily, so importing this module costs nothing.
"""
from __future__ import annotations

from pathlib import Path

from contract.wire import MERGE_PATCH


def api_client(kubeconfig: Path | None = None):
    """An ApiClient: in-cluster credentials when no kubeconfig is named and they exist, else the kubeconfig."""
    from kubernetes import client, config

    if kubeconfig is not None:
        return config.new_client_from_config(config_file=str(kubeconfig))
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        return config.new_client_from_config()
    return client.ApiClient(configuration)


def core_v1(kubeconfig: Path | None = None):
    from kubernetes import client

    return client.CoreV1Api(api_client(kubeconfig))


def write_configmap(core_v1_api, body: dict, *, timeout_s: float = 10.0) -> None:
    """Create the ConfigMap `body` names; when it exists (409), merge-patch it. Other failures raise
    the client's ApiException (or urllib3's HTTPError) for the caller to type."""
    from kubernetes.client.exceptions import ApiException

    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    try:
        core_v1_api.create_namespaced_config_map(namespace, body, _request_timeout=timeout_s)
    except ApiException as exc:
        if exc.status != 409:
            raise
        core_v1_api.patch_namespaced_config_map(name, namespace, body, _content_type=MERGE_PATCH,
                                                _request_timeout=timeout_s)
