"""A card's per-pod SM use never adds up to more than the card's measured use, in either
metric profile, over generated pods and processes (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from metrics_text import parse, select

from gpumon.exporter.attribution import build_view, usages
from gpumon.exporter.cgroups import ContainerKey
from gpumon.exporter.exposition import render
from gpumon.exporter.pod_metadata import PodMeta
from gpumon.gpu.model import HEALTHY, FastFields, GpuIdentity, GpuSample, ProcessSample, Snapshot
from gpumon.k8s.sharing import ContainerLimits

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Float sums of scaled shares may pass the card by rounding, never by more.
EPSILON = 1e-9

ratio = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
process = st.tuples(
    st.integers(0, 2),  # GPU
    st.integers(0, 5),  # container (pod p<n>, one container each)
    st.one_of(st.none(), ratio),  # SM sample, None when the device gives none
    st.integers(0, 1 << 34),  # memory
)


@PROPERTY
@given(
    cards=st.lists(st.one_of(st.none(), ratio), min_size=3, max_size=3),
    processes=st.lists(process, max_size=24),
)
def test_per_pod_sm_use_never_adds_up_to_more_than_the_card(
    cards: list[float | None], processes: list[tuple[int, int, float | None, int]]
) -> None:
    pods = {
        f"uid-{n}": PodMeta(f"uid-{n}", "ml", f"p{n}", (), (ContainerLimits("c", {}),), {f"cid-{n}": "c"}, {})
        for n in range(6)
    }
    pids = {pid: ContainerKey(f"uid-{c}", f"cid-{c}") for pid, (_, c, _, _) in enumerate(processes, 1)}
    gpus = [
        GpuSample(
            GpuIdentity(i, f"GPU-{i}", "A100", f"0000:0{i}:00.0"),
            FastFields(
                utilization_ratio=util,
                processes=tuple(
                    ProcessSample(pid, memory, sm)
                    for pid, (g, _, sm, memory) in enumerate(processes, 1)
                    if g == i
                ),
            ),
            None,
            HEALTHY,
            0.0,
        )
        for i, util in enumerate(cards)
    ]
    out = usages(gpus, pids.get, build_view(pods, {}, None, False), {})
    snap = Snapshot("n", None, tuple(gpus), tuple(out), 0.0, True, True)
    native = parse(render(snap, profile="native").text.decode())
    dcgm = parse(render(snap, profile="dcgm").text.decode())
    for i, util in enumerate(cards):
        limit = 1.0 if util is None else util
        per_pod = [u.utilization_ratio or 0.0 for u in out if u.gpu_index == i]
        assert sum(per_pod) <= limit + EPSILON
        assert sum(select(native, "gpumon_pod_gpu_utilization_ratio", gpu=str(i)).values()) <= limit + EPSILON
        # dcgm has no per-pod figure: a card one container holds carries its pod labels.
        pod_rows = [
            v for ls, v in select(dcgm, "DCGM_FI_DEV_GPU_UTIL", gpu=str(i)).items() if dict(ls).get("pod")
        ]
        assert sum(pod_rows) <= 100 * limit + EPSILON
