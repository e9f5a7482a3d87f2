"""The Prometheus source's answers follow what is wrong, not the size of the fleet, and the
controller decides exactly as it did when every GPU's values came back.

A real Prometheus scrapes real ``gpumon exporter --backend simulated`` processes. Each round the
source runs its own queries; the same round is also read the way the queries read before (every
GPU's value of every signal, at the same evaluation time), and the policy judges both, each with
its own state: their verdicts must be equal at every round while one GPU overheats (quarantine),
is lost while firing (its temperature is gone: the thermal rule is held, not recovered), and is
reset (recovery after the hysteresis). Meanwhile the signals' answers hold that one GPU only.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import pytest
from conftest import ExporterProcess, PrometheusProcess, scraping, simulated_exporters

from gpumon.config.controller import ControllerConfig
from gpumon.controller.configure import build_policy
from gpumon.controller.core.policy import EMPTY_NODE_STATE, NodeRuleState, Policy, evaluate_node
from gpumon.controller.core.promql import (
    FLAG,
    FRESHNESS,
    MISSING,
    SERIES,
    detail_queries,
    node_matcher,
    queries_for,
)
from gpumon.controller.core.signals import NodeReading
from gpumon.controller.core.verdicts import NodeVerdict
from gpumon.controller.shell.signal_sources.prometheus import (
    PrometheusSettings,
    PrometheusSource,
    Sample,
    parse_vector,
    readings_from_results,
)
from gpumon.gpu.health import Severity
from gpumon.gpu.model import HealthState

pytestmark = pytest.mark.prometheus

NODES = ("sized-a", "sized-b")
GPUS = 4
SICK = (NODES[0], 2)
RECOVER_AFTER_SECONDS = 4.0
DEADLINE_SECONDS = 90.0
SETTLE_SECONDS = 1.5
WARM = 1  # another GPU of the sick node


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ExporterProcess]]:
    with simulated_exporters(tmp_path_factory, NODES, GPUS) as out:
        yield out


@pytest.fixture(scope="module")
def prom(
    tmp_path_factory: pytest.TempPathFactory, fleet: dict[str, ExporterProcess]
) -> Iterator[PrometheusProcess]:
    with scraping(
        tmp_path_factory,
        "prometheus-sized",
        fleet,
        'count(gpumon_gpu_recovery_action{action="none"} == 1)',
        GPUS * len(NODES),
    ) as server:
        yield server


def policy() -> Policy:
    """The built-in rules, thermal-unhealthy at once and every recovery after a few seconds; the
    Xid rules off (a reset does not take an Xid out of its window, and their query is as before)."""
    config = ControllerConfig.model_validate(
        {
            "signals": {"stale_after_seconds": 30},
            "policy": {
                "recover_after_seconds": RECOVER_AFTER_SECONDS,
                "rules": [
                    {"name": "thermal-unhealthy", "for": 0},
                    {"name": "xid-unhealthy", "enabled": False},
                    {"name": "xid-degraded", "enabled": False},
                ],
            },
        }
    )
    return build_policy(config)


class Both:
    """A round of the source, the same round read as before, and the policy's verdicts on each."""

    def __init__(self, url: str, session: aiohttp.ClientSession, pol: Policy) -> None:
        self.url, self.session, self.policy = url, session, pol
        self.at = 0.0
        self.states: dict[bool, NodeRuleState] = {True: EMPTY_NODE_STATE, False: EMPTY_NODE_STATE}
        # The node the policy holds state on is read GPU by GPU, as the reconciler has it read.
        self.src = PrometheusSource(
            PrometheusSettings(url, retries=1),
            pol.rules,
            session,
            wall_clock=lambda: self.at,
            held=lambda: {SICK[0]} if self.states[True].targets else set(),
        )
        self.answers: dict[str, list[Sample]] = {}

    async def query(self, promql: str) -> list[Sample]:
        params = {"query": promql, "time": f"{self.at:.3f}"}
        async with self.session.get(self.url + "/api/v1/query", params=params) as resp:
            return parse_vector(await resp.json())

    def every_query(self) -> dict[str, str]:
        """Both steps' queries, the second for every node."""
        rules = self.policy.rules
        return {**queries_for(rules, self.policy.health.xid_window_seconds), **detail_queries(rules, NODES)}

    async def before(self) -> NodeReading | None:
        """What the source read before: every GPU's value of each signal (the missing-queries
        said which GPUs had none, as a None value did)."""
        queries = self.every_query()
        for sig, series in SERIES.items():
            if sig.value in queries or FLAG + sig.value in queries:
                queries[sig.value] = series.selector + (" == 1" if series.one_hot is not None else "")
        results = {name: await self.query(q) for name, q in queries.items()}
        return readings_from_results(results, self.policy.rules, now=self.at).get(SICK[0])

    async def round(self) -> NodeVerdict:
        # A little in the past: a scrape that started before the evaluation time but landed
        # between two of the round's queries would give the two reads different data.
        self.at = time.time() - SETTLE_SECONDS
        await self.src.poll_once()
        self.answers = {name: await self.query(q) for name, q in self.every_query().items()}
        evaluations = {}
        for filtered, reading in (
            (True, self.src.current().nodes.get(SICK[0])),
            (False, await self.before()),
        ):
            ev = evaluate_node(SICK[0], {}, reading, self.states[filtered], self.at, self.policy)
            self.states[filtered] = ev.state
            evaluations[filtered] = ev
        # The verdicts, the state behind them (pending rules, clearing timers) and the wake-ups.
        assert evaluations[True] == evaluations[False], "the filtered answers decided otherwise"
        return evaluations[True].verdict

    def uuid(self, node: str, gpu: int) -> str:
        ids = self.answers[FRESHNESS]
        return next(s.labels["uuid"] for s in ids if (s.labels["node"], s.labels["gpu"]) == (node, str(gpu)))

    def bad(self) -> set[tuple[str, str]]:
        """The GPUs named in any signal's answers (the GPUs some rule could hold for, or lacking a
        series), by node and index."""
        index = {s.labels["uuid"]: s.labels["gpu"] for s in self.answers[FRESHNESS]}
        out = set()
        for name, samples in self.answers.items():
            if name.removeprefix(MISSING).removeprefix(FLAG) in {s.value for s in SERIES}:
                out |= {(s.labels["node"], index[s.labels["uuid"]]) for s in samples}
        return out

    async def until(self, done: Callable[[NodeVerdict], bool], what: str) -> NodeVerdict:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            verdict = await self.round()
            if done(verdict):
                return verdict
            assert time.monotonic() < deadline, f"not {what}: {verdict}"


@pytest.fixture
async def both(prom: PrometheusProcess) -> AsyncIterator[Both]:
    async with aiohttp.ClientSession() as session:
        yield Both(prom.url, session, policy())


def rules_of(v: NodeVerdict) -> set[str]:
    return {f.rule for g in v.gpus for f in g.findings}


async def test_only_the_bad_gpu_comes_back_and_quarantine_and_recovery_decide_as_before(
    fleet: dict[str, ExporterProcess], both: Both
) -> None:
    sick = fleet[SICK[0]]
    v = await both.until(lambda v: len(both.src.current().nodes) == len(NODES), "every node read")
    assert v.severity is None and both.bad() == set(), "a healthy fleet: empty answers"
    assert not any(r.gpus_read for r in both.src.current().nodes.values()), "each read as a whole"

    # Warm: only the degraded rule (87 C, for 5 minutes) holds, pending; the loosest rule's
    # threshold is the filter, or the pending rule would not start.
    sick.inject({"gpu": WARM, "fault": "overheat", "celsius": 90})
    await both.until(
        lambda v: both.uuid(SICK[0], WARM) in both.states[True].targets, "the degraded rule pending"
    )
    assert both.bad() == {(SICK[0], str(WARM))}
    readings = both.src.current().nodes
    assert readings[SICK[0]].gpus_read and not readings[NODES[1]].gpus_read, "the warm node GPU by GPU"
    sick.inject({"gpu": WARM, "fault": "clear"})
    await both.until(lambda v: not both.states[True].targets, "cool again")

    sick.inject({"gpu": SICK[1], "fault": "overheat", "celsius": 97})
    v = await both.until(lambda v: v.severity is Severity.UNHEALTHY, "quarantined for heat")
    assert rules_of(v) == {"thermal-unhealthy"}
    assert both.bad() == {(SICK[0], str(SICK[1]))}, "one hot GPU: one GPU in the answers"

    # Lost while firing: its temperature series goes, which holds the thermal rule (unknown), not
    # lets it recover; the only GPU in the answers is still this one.
    sick.inject({"gpu": SICK[1], "fault": "lost"})
    v = await both.until(lambda v: "gpu-lost" in rules_of(v), "lost")
    for _ in range(int(RECOVER_AFTER_SECONDS) + 2):
        v = await both.round()
        assert "thermal-unhealthy" in rules_of(v) and not v.gpus[0].recovering, "held while unknown"
    assert both.bad() == {(SICK[0], str(SICK[1]))}

    sick.inject({"gpu": SICK[1], "fault": "clear"})
    await both.until(lambda v: bool(v.gpus) and v.gpus[0].recovering, "recovering after the reset")
    await both.until(lambda v: not v.gpus, "recovered after the hysteresis")
    # The GPU's slow fields (ECC, row remapping) come back with the exporter's next slow read and
    # Prometheus's next scrape of it, which can be after the rules let go: until then it lacks
    # those series and their missing-queries name it (the verdict does not wait for them).
    await both.until(lambda v: not both.bad(), "no GPU in the answers again")


async def test_the_exporters_verdicts_come_back_for_the_repair_ladder_and_only_the_bad_ones(
    fleet: dict[str, ExporterProcess], prom: PrometheusProcess
) -> None:
    """With ``verdicts`` (a pool repairs), every GPU reads the exporter's verdict although no rule
    reads it: healthy when absent from the answer, which holds the GPUs judged worse only."""
    node, gpu = NODES[1], GPUS - 1
    async with aiohttp.ClientSession() as session:
        # Held, as a node the repair ladder works on is (quarantined): read GPU by GPU.
        rules = policy().rules
        src = PrometheusSource(
            PrometheusSettings(prom.url, retries=1, verdicts=True), rules, session, held=lambda: {node}
        )
        flag_query = src.queries()[FLAG + "exporter_health"]
        health_query = detail_queries(rules, [node], verdicts=True)["exporter_health"]

        async def states() -> dict[int, HealthState | None]:
            """This node's GPUs (the other test's node may hold an Xid for minutes)."""
            await src.poll_once()
            reading = src.current().nodes.get(node)
            return (
                {g.index: None if g.health is None else g.health.state for g in reading.gpus}
                if reading
                else {}
            )

        async def until(want: HealthState) -> dict[int, HealthState | None]:
            deadline = time.monotonic() + DEADLINE_SECONDS
            while (now := await states()).get(gpu) is not want:
                assert time.monotonic() < deadline, f"{node} GPU {gpu} never read {want}: {now}"
            return now

        healthy = await until(HealthState.HEALTHY)
        assert list(healthy.values()) == [HealthState.HEALTHY] * GPUS
        # Heat, not a lost GPU: that leaves an Xid the exporter holds against it for 10 minutes.
        fleet[node].inject({"gpu": gpu, "fault": "overheat", "celsius": 97})
        try:
            hot = await until(HealthState.UNHEALTHY)
            assert [i for i, state in hot.items() if state is not HealthState.HEALTHY] == [gpu]
            async with session.get(prom.url + "/api/v1/query", params={"query": health_query}) as resp:
                answer = parse_vector(await resp.json())
            assert [s.labels["state"] for s in answer] == ["unhealthy"], "this node's bad GPU only"
            async with session.get(prom.url + "/api/v1/query", params={"query": flag_query}) as resp:
                flagged = parse_vector(await resp.json())
            mine = [s.labels["gpu"] for s in flagged if s.labels["node"] == node]
            assert mine == [str(gpu)], "the fleet-wide step names it by its healthy series alone"
        finally:
            fleet[node].inject({"gpu": gpu, "fault": "clear"})
        await until(HealthState.HEALTHY)


async def test_a_node_matcher_selects_exactly_its_nodes(prom: PrometheusProcess) -> None:
    """The second step's matcher, in the real Prometheus: its names are matched literally (an
    unescaped dot would match the dash of ``sized-a``)."""

    async def gpus(matcher: str) -> int:
        query = f"count(gpumon_gpu_info{{{matcher}}}) or vector(0)"
        async with (
            aiohttp.ClientSession() as session,
            session.get(prom.url + "/api/v1/query", params={"query": query}) as resp,
        ):
            return int(parse_vector(await resp.json())[0].value)

    assert await gpus(node_matcher(list(NODES))) == GPUS * len(NODES)
    assert await gpus(node_matcher([NODES[0]])) == GPUS
    assert await gpus(node_matcher(["sized.a", "sized-"])) == 0, "literally: no dot, no prefix"
