"""Config in, the controller's frozen values out: its policy (rules), and its pools.

The declarations are validated by the config layer (gpumon.config, gpumon.config.rules,
gpumon.config.pools) when config loads; this is the one place they become core values.
"""

from __future__ import annotations

from types import MappingProxyType

from gpumon.config.controller import ControllerConfig
from gpumon.config.pools import PoolConfig
from gpumon.config.repair import RepairConfig
from gpumon.config.rules import RuleConfig
from gpumon.controller.core.contract.repair import LadderStep
from gpumon.controller.core.demand import SharedCards, Template
from gpumon.controller.core.device_claims import TemplateDevices
from gpumon.controller.core.objects import Taint
from gpumon.controller.core.policy import Policy, Rule
from gpumon.controller.core.pools import Pool, ScaleTarget
from gpumon.controller.core.repair import RepairPolicy
from gpumon.controller.core.repair_jobs import PoolRepair
from gpumon.k8s.selectors import parse_selector

_KNOWN_PLURALS = {
    "MachineDeployment": "machinedeployments",
    "MachineSet": "machinesets",
    "MachinePool": "machinepools",
}


def rule_from_config(r: RuleConfig, default_recover_after: float) -> Rule:
    return Rule(
        name=r.name,
        signal=r.signal,
        severity=r.severity,
        op=r.op,
        threshold=r.numeric_threshold,
        for_seconds=r.for_,
        recover_after_seconds=default_recover_after if r.recover_after is None else r.recover_after,
        scope=r.scope,
        reason=r.reason,
        action=r.action,
        xids=frozenset(r.xids) if r.xids is not None else None,
        query=r.query,
        node_selector=MappingProxyType(dict(r.node_selector)),
        pools=frozenset(r.pools) if r.pools is not None else None,
    )


def build_policy(config: ControllerConfig) -> Policy:
    """The rules in force and how they are judged: the health section's policy is the one the
    exporter's sampler gets from the same section (gpumon.gpu.health)."""
    p = config.policy
    return Policy(
        rules=tuple(rule_from_config(r, p.recover_after_seconds) for r in p.effective_rules),
        health=p.health.policy(),
        stale_after_seconds=config.signals.stale_after_seconds,
        flap_window_seconds=p.flap_window_seconds,
        flap_max_onsets=p.flap_max_onsets,
        pool_label=config.breaker.pool_label,
        default_recover_after_seconds=p.recover_after_seconds,
    )


def pool_from_config(p: PoolConfig) -> Pool:
    t = p.target
    selector = parse_selector(p.node_selector)
    tc = p.template
    # A pool's nodes carry its selector's labels, so a pod selecting them can land on a new one.
    labels = {**selector.match_labels, **tc.labels}
    return Pool(
        name=p.name,
        target=ScaleTarget(
            t.group,
            t.version,
            t.kind,
            t.resource or _KNOWN_PLURALS.get(t.kind, t.kind.lower() + "s"),
            t.namespace,
            t.name,
        ),
        node_selector=p.node_selector,
        template=Template(
            resources=MappingProxyType(tc.allocatable()),
            labels=MappingProxyType(labels),
            taints=tuple(Taint(x.key, x.effect, x.value) for x in tc.taints),
            shared=SharedCards(tc.shared_gpus.cards, tc.shared_gpus.memory_per_card * 1000)
            if tc.shared_gpus
            else None,
            dra=TemplateDevices(tc.dra.slice_devices(f"{p.name}-template")) if tc.dra else None,
        ),
        min_replicas=p.min_replicas,
        max_replicas=p.max_replicas,
        max_step=p.max_step,
        scale_up_cooldown_seconds=p.scale_up_cooldown_seconds,
        scale_down_cooldown_seconds=p.scale_down_cooldown_seconds,
        scale_down_unneeded_seconds=p.scale_down_unneeded_seconds,
        scale_down_drain_timeout_seconds=p.scale_down_drain_timeout_seconds,
        arriving_timeout_seconds=p.arriving_timeout_seconds,
        headroom_nodes=p.headroom_nodes,
        replace_quarantined=p.replace_quarantined,
        allow_cluster_autoscaler=p.allow_cluster_autoscaler,
        repair=None if p.repair is None else pool_repair(p.repair),
    )


def pool_repair(r: RepairConfig) -> PoolRepair:
    jobs = {
        LadderStep.RESET: r.reset_job,
        LadderStep.REBOOT: r.reboot_job,
        LadderStep.VALIDATE: r.validation_job,
    }
    return PoolRepair(
        policy=repair_policy(r),
        templates=MappingProxyType(
            {s: MappingProxyType(j.template) for s, j in jobs.items() if j is not None}
        ),
    )


def repair_policy(r: RepairConfig) -> RepairPolicy:
    return RepairPolicy(
        reset="reset" in r.steps,
        reboot="reboot" in r.steps,
        replace="replace" in r.steps,
        replace_immediately=r.replace_immediately,
        max_attempts=r.max_attempts,
        max_concurrent=r.max_concurrent,
        reset_deadline_seconds=r.reset_deadline_seconds,
        reboot_deadline_seconds=r.reboot_deadline_seconds,
        replace_deadline_seconds=r.replace_deadline_seconds,
        free_deadline_seconds=r.free_deadline_seconds,
        flap_window_seconds=r.flap_window_seconds,
        validate=r.validation_job is not None,
        validate_deadline_seconds=r.validate_deadline_seconds,
    )
