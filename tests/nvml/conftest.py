"""The NVML tier runs against NVIDIA's mock libnvidia-ml from the tools cache, never without it:
setup builds it (`make setup`, or `bash hack/build-tools.sh mocknvml`), so a missing library
fails every test of the tier with ToolsMissing's message instead of skipping them."""

from __future__ import annotations

import pytest

from gpumon.devcluster.binaries import MockNvml, locate_mock_nvml


@pytest.fixture(scope="session")
def mock() -> MockNvml:
    return locate_mock_nvml()
