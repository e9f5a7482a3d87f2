"""The state directory of a cluster started by ``gpumon devcluster up``: who supervises it,
where its kubeconfig is, and each component's pid and health endpoint, so that ``down``,
``status`` and ``kubeconfig`` work from another shell."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from gpumon.devcluster.components import HealthCheck

DEFAULT_DIR = Path("~/.gpumon/devcluster")
_STATE_FILE = "state.json"


@dataclass(frozen=True)
class ComponentState:
    name: str
    pid: int
    log: str
    health: HealthCheck


@dataclass(frozen=True)
class State:
    supervisor_pid: int
    server: str
    kubeconfig: str
    ca_cert: str
    client_cert: str
    client_key: str
    components: tuple[ComponentState, ...]


def cluster_root(state_dir: Path) -> Path:
    return state_dir / "cluster"


def supervisor_log(state_dir: Path) -> Path:
    return state_dir / "supervisor.log"


def save(state: State, state_dir: Path) -> None:
    tmp = state_dir / (_STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    tmp.replace(state_dir / _STATE_FILE)  # readers never see half a file


def load(state_dir: Path) -> State | None:
    try:
        doc = json.loads((state_dir / _STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    comps = tuple(
        ComponentState(c["name"], c["pid"], c["log"], HealthCheck(**c["health"]))
        for c in doc.pop("components")
    )
    return State(components=comps, **doc)


def forget(state_dir: Path) -> None:
    (state_dir / _STATE_FILE).unlink(missing_ok=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
