"""``gpumon exporter`` builds only its own command's parser: a process keeps every module it
imported, and the exporter runs on every GPU node (bench/RESULTS.md, "Exporter footprint")."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# Modules only the other commands import: the test cluster's PKI (cryptography), the demo, the
# controller. The exporter's flags need none of them.
_NOT_FOR_THE_EXPORTER = (
    "gpumon.devcluster",
    "gpumon.demo",
    "gpumon.controller",
    "cryptography",
    "kubernetes_asyncio",
)


def test_the_exporters_parser_imports_no_other_command() -> None:
    probe = (
        "import sys\n"
        "from gpumon import cli\n"
        "try:\n"
        "    cli.main(['exporter', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in sys.modules if m.startswith({_NOT_FOR_THE_EXPORTER!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


# What `gpumon exporter --backend nvml` as the Helm chart runs it must never import, while it runs: the
# controller's config models (its pools, rules and CEL), pydantic-settings (gpumon.config reads
# the GPUMON_ variables itself), YAML (the config file is plain JSON, as the Helm chart writes it,
# and the pod's service account needs no kubeconfig), the simulator, grpc and protobuf (the
# pod-resources client is gpumon's own: docs/pod-attribution.md), and what the check above keeps
# out of its parser.
_NOT_IN_THE_RUNNING_EXPORTER = (
    *_NOT_FOR_THE_EXPORTER,
    "gpumon.config.controller",
    "gpumon.config.pools",
    "gpumon.config.rules",
    "gpumon.k8s.dra_cel",
    "celpy",
    "pydantic_settings",
    "dotenv",
    "yaml",
    "gpumon.devices.simulated",
    "gpumon.devices.simulated_http",
    "grpc",
    "google.protobuf",
    "gpumon.exporter.podresources.api_pb2",
)


def _imported(importtime: str) -> set[str]:
    """Every module ``python -X importtime`` reported, lazy imports included."""
    return {m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", importtime, re.M)}


def test_the_running_exporter_imports_only_what_its_configuration_needs(tmp_path: Path) -> None:
    """The real command, run until its first slow tick is rendered (pod attribution and every
    background task started), its imports read from ``-X importtime``: a process keeps every
    module it imported, on every GPU node (docs/exporter.md, "What the exporter imports")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMON_", "KUBE"))}
    env |= {"HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}  # no kubeconfig: as in a pod, no YAML
    config = tmp_path / "exporter.yaml"  # plain JSON, as the Helm chart writes it
    config.write_text('{"listen_address": "127.0.0.1", "port": 0, "pods": {"enabled": true}}')
    argv = [
        sys.executable, "-X", "importtime", "-m", "gpumon.cli", "exporter", "--backend", "nvml",
        "--nvml-library", str(tmp_path / "libnvidia-ml.so.1"), "--config", str(config),
    ]  # fmt: skip
    err = tmp_path / "stderr"
    with err.open("w") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=sink, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None or b'sample_duration_seconds_count{cadence="slow"}' not in _get(url):
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-2000:]
            found = re.search(r"serving metrics at (\S+)", err.read_text())
            url = found.group(1) if found else None
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    imported = _imported(err.read_text())
    assert "gpumon.exporter.sampler" in imported and "pynvml" in imported  # the probe reads them
    assert sorted(m for m in imported if m.startswith(_NOT_IN_THE_RUNNING_EXPORTER)) == []


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        body: bytes = r.read()
        return body


def test_help_still_lists_every_command() -> None:
    from gpumon import cli

    parser = cli.build_parser()
    choices = next(a for a in parser._actions if a.dest == "command").choices
    assert set(cli.COMMANDS) <= set(choices)
    assert cli.main(["version"]) == 0
