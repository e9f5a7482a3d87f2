"""Fixtures for tests against the real local control plane, shared by every tier that needs
one (registered for the whole suite from tests/conftest.py, so a session starts at most one).

``devcluster``: one control plane per test session, started the first time a test asks for it
and stopped at the end of the session (its files stay in pytest's temporary directory for
post-mortems). ``api``: an async kubernetes_asyncio client as cluster-admin, independent of
gpumon's; ``kube``: gpumon's own client (gpumon.kube.client) as cluster-admin. ``namespace``: a
fresh namespace per test, deleted without waiting. ``make_nodes``: kwok GPU nodes from a
template, deleted after the test. ``cluster_api``: Cluster API's own manager and the kwok
infrastructure provider on the session's control plane, started the first time a test asks.
Tests share one cluster: a test that schedules pods gives its nodes a label of its own
(``test_id``) and selects them with it."""

from __future__ import annotations

import re
import secrets
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from gpumon.devcluster import cluster_api as capi_manager
from gpumon.devcluster import karpenter as karpenter_controller
from gpumon.devcluster import nodes
from gpumon.devcluster.binaries import (
    MockNvml,
    ToolsMissing,
    locate,
    locate_cluster_api,
    locate_helm,
    locate_karpenter,
    locate_mock_nvml,
)
from gpumon.devcluster.cluster import DevCluster
from gpumon.devcluster.nodemaker import NodeMaker
from gpumon.devcluster.waiting import eventually
from gpumon.kube.client import KubeClient
from gpumon.kube.credentials import Credentials
from gpumon.kube.kubeconfig import from_kubeconfig


def _slug(text: str, limit: int = 30) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-")


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    try:
        tools = locate()
    except ToolsMissing as e:
        pytest.fail(str(e), pytrace=False)
    cluster = DevCluster.start(tmp_path_factory.mktemp("devcluster"), tools=tools)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def cluster_api(devcluster: DevCluster) -> capi_manager.ClusterApiRunning:
    """Cluster API's own manager and the kwok infrastructure provider on the session's control
    plane, started by the first test that asks (about 10 s) and stopped with the cluster."""
    try:
        tools = locate_cluster_api()
    except ToolsMissing as e:
        pytest.fail(str(e), pytrace=False)
    return capi_manager.start(devcluster, tools)


# The instance types the session's Karpenter offers (fixed when it starts): whole GPUs, GPUs
# shared by memory and core share (gpushare/cGPU), and MIG instances (mixed strategy).
KARPENTER_GPU_TYPE = karpenter_controller.InstanceType("gpu-8x-a100", nodes.NodeTemplate(gpus=8))
KARPENTER_TYPES = (
    KARPENTER_GPU_TYPE,
    karpenter_controller.InstanceType(
        "share-4x-t4", nodes.NodeTemplate(gpus=0, shared=nodes.SharedGpus(4, 16)), price=2.0
    ),
    karpenter_controller.InstanceType(
        "mig-2x-a100", nodes.NodeTemplate(gpus=2, mig={"3g.40gb": 2}), price=3.0
    ),
)


@pytest.fixture(scope="session")
def karpenter_instance_types(devcluster: DevCluster) -> tuple[karpenter_controller.InstanceType, ...]:
    """Karpenter with its kwok provider on the session's control plane, started by the first
    test that asks, its NodeRepair gate on; the instance types it offers."""
    try:
        tools = locate_karpenter()
    except ToolsMissing as e:
        pytest.fail(str(e), pytrace=False)
    karpenter_controller.start(devcluster, KARPENTER_TYPES, tools, node_repair=True)
    return KARPENTER_TYPES


@pytest.fixture(scope="session")
def helm() -> Path:
    try:
        return locate_helm()
    except ToolsMissing as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def mock() -> MockNvml:
    """NVIDIA's mock libnvidia-ml; a missing one fails the test with ToolsMissing's message."""
    return locate_mock_nvml()


@pytest.fixture
async def api(devcluster: DevCluster) -> AsyncIterator[client.ApiClient]:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(devcluster.kubeconfig), client_configuration=cfg)
    async with client.ApiClient(cfg) as api_client:
        yield api_client


def gpumon_credentials(api: client.ApiClient) -> Credentials:
    """The identity of a kubernetes_asyncio client (its client certificate and CA) for gpumon's."""
    c = api.configuration
    context = ssl.create_default_context(cafile=c.ssl_ca_cert)
    context.load_cert_chain(c.cert_file, c.key_file)
    return Credentials(c.host, context)


@pytest.fixture
async def kube(devcluster: DevCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient(from_kubeconfig(devcluster.kubeconfig)) as client_:
        yield client_


@pytest.fixture
def test_id(request: pytest.FixtureRequest) -> str:
    """Unique per test: the namespace, the node-name prefix, a label value to select own nodes."""
    return f"{_slug(request.node.name)}-{secrets.token_hex(3)}"


@pytest.fixture
async def namespace(api: client.ApiClient, test_id: str) -> AsyncIterator[str]:
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": test_id}})

    async def default_service_account() -> object | None:
        # Pods are refused until the service-account controller has created `default`.
        accounts = await core.list_namespaced_service_account(test_id)
        return next((a for a in accounts.items if a.metadata.name == "default"), None)

    await eventually(default_service_account, what=f"service account default in {test_id}")
    yield test_id
    await core.delete_namespace(test_id)


@pytest.fixture
async def make_nodes(kube: KubeClient, test_id: str) -> AsyncIterator[NodeMaker]:
    maker = NodeMaker(kube, test_id)
    yield maker
    await maker.delete_all()
