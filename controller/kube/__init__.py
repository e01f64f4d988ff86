"""The Kubernetes adapters: the API calls of cluster mode, Lease election, the CRD generator.

The only controller modules that talk to an API server (through the official
client, an ApiClient passed in).
"""
