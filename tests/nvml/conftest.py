"""The NVML tier runs against NVIDIA's mock libnvidia-ml from the tools cache, never without it:
setup builds it (`make setup`, or `bash hack/build-tools.sh mocknvml`), so a missing library
fails every test of the tier with ToolsMissing's message instead of skipping them. The ``mock``
fixture is suite-wide (tests/devcluster_fixtures.py): the image tier mounts the same library."""
