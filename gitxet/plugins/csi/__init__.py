"""Kubernetes CSI node plugin: Identity and Node gRPC services that publish gitxet mounts.

Nothing is imported here, so that importing a submodule pulls in only what it needs.
"""
