"""End-to-end tests run against the same local control plane fixtures as tests/cluster."""

from cluster.conftest import api, devcluster  # noqa: F401 - re-exported fixtures
