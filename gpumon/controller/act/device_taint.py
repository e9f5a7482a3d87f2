"""Writes gpumon's DeviceTaintRules (the plan is :func:`gpumon.controller.core.device_taints.plan_rules`),
and finds out whether the API server serves them at all."""

from __future__ import annotations

import contextlib
from typing import Any

from gpumon.controller.core.device_taints import (
    GROUP_VERSION_PATH,
    RESOURCE,
    RULES_PATH,
    RulesPlan,
    RuleView,
    rule_from_json,
)
from gpumon.kube.client import Conflict, KubeApi, NotFound


async def served(api: KubeApi) -> bool:
    """Whether ``resource.k8s.io/v1beta2`` lists ``devicetaintrules`` (discovery is open to every
    authenticated client). False on 404: the version or the resource is switched off."""
    try:
        doc = await api.get(GROUP_VERSION_PATH)
    except NotFound:
        return False
    resources: list[Any] = doc.get("resources") or []
    return any(isinstance(r, dict) and r.get("name") == RESOURCE for r in resources)


async def apply_rules(api: KubeApi, plan: RulesPlan) -> list[RuleView]:
    """Create and delete as planned; returns the rules created (as the API answered). A rule
    already there (409) or already gone (404) is what was wanted."""
    created = []
    for rule in plan.create:
        with contextlib.suppress(Conflict):
            created.append(rule_from_json(await api.post(RULES_PATH, rule.to_json())))
    for name in plan.delete:
        with contextlib.suppress(NotFound):
            await api.delete(f"{RULES_PATH}/{name}")
    return created
