"""The one way to the Kubernetes API, for every program: the client, its credentials, and
the informers with their per-process registry."""
