"""A container of the rendered chart, started in the built image the way the kubelet would start
it, with ``buildah run --isolation chroot`` (``podman run`` cannot set rlimits here).

What the pod spec says is mapped, never assumed: command and args over the image's ENTRYPOINT
and CMD, literal env and env from the pod's own fields, the user and group, dropped and added
capabilities, every volume (ConfigMaps and Secrets from the same render written to files,
hostPaths onto test directories), and the service-account token when the pod mounts one. A
setting this module cannot map fails the test with its name: a chart that renders but whose
pod could not start must not pass here.

Not emulated by a chroot: the pod's network (the host's is shared, so the test picks the chart's
ports), its PID namespace (hostPID), ``allowPrivilegeEscalation`` and ``readOnlyRootFilesystem``
(checked afterwards instead: the container must have written nothing outside its mounts)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

Doc = dict[str, Any]


def find(docs: Sequence[Doc], kind: str, component: str) -> Doc:
    (doc,) = [
        d
        for d in docs
        if d["kind"] == kind and d["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    return doc


@dataclass(frozen=True)
class ImageConfig:
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]


@dataclass
class Host:
    """What the node gives the pod: directories for hostPath volumes (by path), the values of
    the pod's fieldRefs, and the service account's token directory and API endpoint."""

    host_paths: Mapping[str, Path] = field(default_factory=dict)
    field_refs: Mapping[str, str] = field(default_factory=dict)
    service_account: Path | None = None
    api_host: str = ""
    api_port: int = 0
    # What the node's runtime adds (the NVIDIA toolkit's library injection): host -> container.
    runtime_mounts: Mapping[Path, str] = field(default_factory=dict)
    runtime_env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Launch:
    command: list[str]
    options: list[str]  # buildah run options
    ports: dict[str, int]
    mount_targets: list[str]
    readiness: str | None  # path of the readiness probe
    liveness: str | None
    user: str | None


def _fail(message: str) -> Any:
    pytest.fail(message, pytrace=False)


def _env(container: Doc, docs: Sequence[Doc], host: Host) -> dict[str, str]:
    env: dict[str, str] = {}
    if container.get("envFrom"):
        _fail(f"envFrom is not mapped by this test: {container['envFrom']}")
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
            continue
        source = e.get("valueFrom", {})
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path not in host.field_refs:
                _fail(f"env {e['name']} reads the pod's {path}, which the test does not give")
            env[e["name"]] = host.field_refs[path]
        elif "configMapKeyRef" in source or "secretKeyRef" in source:
            kind, ref = (
                ("ConfigMap", source["configMapKeyRef"])
                if "configMapKeyRef" in source
                else (
                    "Secret",
                    source["secretKeyRef"],
                )
            )
            env[e["name"]] = _files(docs, kind, ref["name"])[ref["key"]].decode()
        else:
            _fail(f"env {e['name']}: {source} is not mapped by this test")
    return env


def _files(docs: Sequence[Doc], kind: str, name: str) -> dict[str, bytes]:
    """The keys of a ConfigMap or Secret the chart renders, as file contents."""
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    if not found:
        _fail(f"the pod uses {kind} {name}, which the chart does not render (it would not start)")
    doc = found[0]
    out = {k: str(v).encode() for k, v in (doc.get("data") or {}).items()} if kind == "ConfigMap" else {}
    if kind == "Secret":
        out = {k: base64.b64decode(v) for k, v in (doc.get("data") or {}).items()}
        out |= {k: str(v).encode() for k, v in (doc.get("stringData") or {}).items()}
    return out


def _volume_source(volume: Doc, docs: Sequence[Doc], host: Host, scratch: Path) -> Path:
    name = volume["name"]
    if "configMap" in volume or "secret" in volume:
        kind, ref = (
            ("ConfigMap", volume["configMap"]) if "configMap" in volume else ("Secret", volume["secret"])
        )
        files = _files(docs, kind, ref.get("name") or ref.get("secretName", ""))
        d = scratch / f"volume-{name}"
        d.mkdir()
        items = ref.get("items") or [{"key": k, "path": k} for k in files]
        for item in items:
            (d / item["path"]).parent.mkdir(parents=True, exist_ok=True)
            (d / item["path"]).write_bytes(files[item["key"]])
        return d
    if "hostPath" in volume:
        path = volume["hostPath"]["path"]
        if path not in host.host_paths:
            _fail(f"volume {name} mounts the node's {path}, which the test does not map")
        return host.host_paths[path]
    if "emptyDir" in volume:
        d = scratch / f"volume-{name}"
        d.mkdir(mode=0o777)
        return d
    return _fail(f"volume {name}: {volume} is not mapped by this test")


def launch(
    pod: Doc, container_name: str, docs: Sequence[Doc], image: ImageConfig, host: Host, scratch: Path
) -> Launch:
    spec = pod["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == container_name]
    if spec.get("initContainers"):
        _fail("init containers are not run by this test")
    # Kubernetes: command replaces ENTRYPOINT (and drops CMD); args replace CMD.
    command = list(container.get("command") or image.entrypoint)
    args = container.get("args")
    command += list(args) if args is not None else ([] if container.get("command") else list(image.cmd))

    options: list[str] = []
    env = _env(container, docs, host) | dict(host.runtime_env)
    targets: list[str] = []
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        if m["name"] not in volumes:
            _fail(f"volumeMount {m['name']} has no volume")
        source = _volume_source(volumes[m["name"]], docs, host, scratch)
        if m.get("subPath"):
            source = source / m["subPath"]
        options += ["--volume", f"{source}:{m['mountPath']}" + (":ro" if m.get("readOnly") else "")]
        targets.append(m["mountPath"])
    if spec.get("automountServiceAccountToken", True):
        if host.service_account is None:
            _fail("the pod mounts its service account's token: the test must give one")
        # Debian's /var/run is a symlink to /run, which runc follows in the rootfs; buildah's
        # chroot mounts its own /run/secrets after the volumes, hiding one made through the link.
        target = SERVICE_ACCOUNT_DIR.replace("/var/run/", "/run/", 1)
        options += ["--volume", f"{host.service_account}:{target}:ro"]
        targets.append(target)
        env |= {"KUBERNETES_SERVICE_HOST": host.api_host, "KUBERNETES_SERVICE_PORT": str(host.api_port)}
    for source, target in host.runtime_mounts.items():
        options += ["--volume", f"{source}:{target}:ro"]
        targets.append(target)
    for key, value in env.items():
        options += ["--env", f"{key}={value}"]

    pod_ctx, ctx = spec.get("securityContext") or {}, container.get("securityContext") or {}
    uid = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
    gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
    user = None if uid is None else f"{uid}:{gid if gid is not None else uid}"
    if user is not None:
        options += ["--user", user]
    caps = ctx.get("capabilities") or {}
    options += [a for c in caps.get("drop", []) for a in ("--cap-drop", c)]
    options += [a for c in caps.get("add", []) for a in ("--cap-add", c)]

    ports = {p["name"]: int(p["containerPort"]) for p in container.get("ports", []) if "name" in p}

    def probe_path(probe: Doc | None) -> str | None:
        if probe is None:
            return None
        get = probe.get("httpGet")
        if get is None:
            return _fail(f"probe {probe} is not an httpGet: not mapped by this test")
        return str(get["path"])

    return Launch(
        command,
        options,
        ports,
        targets,
        probe_path(container.get("readinessProbe")),
        probe_path(container.get("livenessProbe")),
        user,
    )


def image_config(image: str) -> ImageConfig:
    argv = ["buildah", "inspect", "--type", "image", image]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    config = json.loads(out.stdout)["OCIv1"]["config"]
    return ImageConfig(tuple(config.get("Entrypoint") or ()), tuple(config.get("Cmd") or ()))


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                # The parent is the 4th field, after the command in parentheses.
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class Running:
    """A container started by :func:`run`; ``log`` has its output."""

    name: str
    process: subprocess.Popen[bytes]
    launch: Launch
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def main_process(self) -> int | None:
        """The container's command (the kubelet's PID 1), under buildah and its chroot helper."""
        entry = self.launch.command[0]
        found = [
            pid
            for pid in _descendants(self.process.pid)
            if entry.encode() in _cmdline(pid) and not _cmdline(pid).startswith(b"buildah")
        ]
        return found[-1] if found else None

    def stop(self, timeout_seconds: float = 30.0) -> int:
        """SIGTERM to the container's command, as the kubelet sends it; its exit code."""
        pid = self.main_process()
        if pid is not None and self.process.poll() is None:
            os.kill(pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"{self.name} did not stop within {timeout_seconds}s of SIGTERM") from None

    def root_filesystem_changes(self) -> list[str]:
        """What the container wrote outside its mounts (``readOnlyRootFilesystem`` would refuse it)."""
        out = subprocess.run(["podman", "diff", self.name], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        changed = [line.split(" ", 1)[1] for line in out.stdout.splitlines() if " " in line]

        def is_mount(path: str) -> bool:
            return any(t == path or t.startswith(path.rstrip("/") + "/") or path.startswith(t + "/")
                       for t in self.launch.mount_targets)  # fmt: skip

        return [p for p in changed if not is_mount(p)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


@contextlib.contextmanager
def run(image: str, launch: Launch, log: Path) -> Iterator[Running]:
    """The container running in the image until the block exits (then stopped and removed)."""
    name = f"gpumon-test-{secrets.token_hex(4)}"
    subprocess.run(["buildah", "from", "--name", name, image], capture_output=True, check=True, timeout=120)
    try:
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["buildah", "run", "--isolation", "chroot", *launch.options, name, "--", *launch.command],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        running = Running(name, process, launch, log)
        try:
            yield running
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True, timeout=120)
