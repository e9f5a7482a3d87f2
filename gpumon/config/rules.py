"""Rule declarations: YAML validated by pydantic when config loads (``policy.rules_file`` and
inline ``policy.rules``); the controller turns them into its frozen ``Rule`` values
(gpumon.controller.configure).

A rules file holds ``rules:``, a list of rules::

    rules:
      - name: gpu-hot
        signal: temperature        # temperature | xid | ecc_uncorrectable | row_remap_failure |
                                   # gpu_lost | memory_utilization | exporter_health |
                                   # recovery_action | promql
        op: ">="                   # > >= < <= == !=
        threshold: 90
        for: 2m                    # how long it must hold before it fires
        recoverAfter: 10m          # how long it must stay false before the GPU recovers
        severity: degraded         # degraded | unhealthy
        scope: gpu                 # gpu | node
        nodeSelector: {gpu.example.com/class: training}
        pools: [a100]

Built-in rules (:func:`builtin_rules`) come first; a rule with a built-in's name is merged over
it key by key (``{name: thermal-degraded, for: 10m}``, ``{name: xid-degraded, enabled:
false}``), except for what the built-in judges (:data:`JUDGEMENT_KEYS`): that is the ``health``
section, which the exporters judge with too. Any error names the rule and the field and becomes
a :class:`ConfigError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from gpumon.config.files import ConfigError, read_yaml_mapping
from gpumon.config.numbers import Float, Int, NoBool
from gpumon.gpu.health import HealthPolicy, Op, Scope, Severity, Signal
from gpumon.gpu.model import HealthState

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> Any:
    """``90``, ``"90s"``, ``"2m"``, ``"1h30m"`` -> seconds; anything else is left for pydantic."""
    if isinstance(value, str):
        text = value.strip()
        parts = _DURATION.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"not a duration (e.g. 30s, 5m, 1h30m): {value!r}") from None
    return value


Duration = Annotated[Float, BeforeValidator(parse_duration), Field(ge=0)]


_THRESHOLD_REQUIRED = frozenset({Signal.TEMPERATURE, Signal.MEMORY_UTILIZATION, Signal.PROMQL})
_STATE_RANKS = {s.value: float(s.rank) for s in HealthState}


class RuleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    signal: Signal
    severity: Severity
    op: Op = Op.GE
    # A number, or for exporter_health a state name (degraded, unhealthy, lost).
    threshold: Annotated[float | str | None, NoBool] = None
    for_: Duration = Field(0.0, alias="for")
    recover_after: Duration | None = Field(None, alias="recoverAfter")
    scope: Scope = Scope.GPU
    # A Kubernetes condition reason: CamelCase.
    reason: str | None = Field(None, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=128)
    action: str | None = Field(None, min_length=1)
    xids: list[Annotated[Int, Field(ge=1)]] | None = Field(None, min_length=1)
    query: str | None = Field(None, min_length=1)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    pools: list[str] | None = Field(None, min_length=1)
    enabled: bool = True

    @model_validator(mode="after")
    def _fits_signal(self) -> RuleConfig:
        sig = self.signal
        if sig is Signal.PROMQL and self.query is None:
            raise ValueError("query: required for signal promql")
        if sig is not Signal.PROMQL and self.query is not None:
            raise ValueError(f"query: only for signal promql, not {sig}")
        if self.xids is not None and sig is not Signal.XID:
            raise ValueError(f"xids: only for signal xid, not {sig}")
        if sig is Signal.XID and self.threshold is not None:
            raise ValueError("threshold: not used by signal xid (list codes in xids)")
        if sig in _THRESHOLD_REQUIRED and self.threshold is None:
            raise ValueError(f"threshold: required for signal {sig}")
        if sig is Signal.EXPORTER_HEALTH:
            if self.threshold is None:
                raise ValueError("threshold: required for signal exporter_health (degraded, unhealthy, lost)")
            if isinstance(self.threshold, str) and self.threshold not in _STATE_RANKS:
                raise ValueError(f"threshold: must be one of {', '.join(_STATE_RANKS)} for exporter_health")
        elif isinstance(self.threshold, str):
            try:
                float(self.threshold)
            except ValueError:
                raise ValueError(f"threshold: must be a number for signal {sig}") from None
        return self

    @property
    def numeric_threshold(self) -> float:
        """The threshold as a number: a state name as its rank; "at least one" when left out
        (boolean signals and counts)."""
        if isinstance(self.threshold, str) and self.threshold in _STATE_RANKS:
            return _STATE_RANKS[self.threshold]
        return 1.0 if self.threshold is None else float(self.threshold)


# What a built-in rule judges, taken from the health section (Xid classes, thermal limits) that
# the exporters' verdict is made of. Set by name in the rules, the controller would judge a GPU
# one way and the exporters another: the two judgements of one GPU the health section exists to
# prevent. When, where and with what words a built-in acts stay the controller's own.
JUDGEMENT_KEYS = ("signal", "op", "threshold", "severity", "scope", "xids")


def builtin_rules(health: HealthPolicy) -> list[dict[str, Any]]:
    """Defaults mirroring NVIDIA's Xid catalog (classes in gpumon.gpu.health) and the
    exporter's thermal limits; each one can be changed or disabled by name."""
    return [
        {"name": "xid-unhealthy", "signal": "xid", "severity": "unhealthy"},
        {"name": "xid-degraded", "signal": "xid", "severity": "degraded"},
        {"name": "gpu-lost", "signal": "gpu_lost", "severity": "unhealthy"},
        {"name": "ecc-uncorrectable", "signal": "ecc_uncorrectable", "severity": "unhealthy"},
        {"name": "row-remap-failure", "signal": "row_remap_failure", "severity": "unhealthy"},
        # The driver's own verdict: any recovery action but NONE (NVML's 0) is a fault.
        {"name": "recovery-action", "signal": "recovery_action", "severity": "unhealthy"},
        {
            "name": "thermal-unhealthy",
            "signal": "temperature",
            "severity": "unhealthy",
            "threshold": health.temperature_unhealthy_celsius,
            "for": "1m",
        },
        {
            "name": "thermal-degraded",
            "signal": "temperature",
            "severity": "degraded",
            "threshold": health.temperature_degraded_celsius,
            "for": "5m",
        },
    ]


def _describe(entry: Any, where: str) -> str:
    name = entry.get("name") if isinstance(entry, Mapping) else None
    return f"rule {name!r} ({where})" if isinstance(name, str) else f"rule at {where}"


def _validation_message(err: ValidationError, what: str) -> str:
    lines = []
    for e in err.errors(include_url=False):
        msg = e["msg"].removeprefix("Value error, ")
        field = ".".join(str(p) for p in e["loc"])
        if not field and ": " in msg:  # model-level checks name their field first
            field, msg = msg.split(": ", 1)
        shown = ""
        quiet = e["type"] in ("missing", "value_error")  # value errors quote the input themselves
        if "input" in e and not isinstance(e["input"], dict | list) and not quiet:
            shown = f" (got {e['input']!r})"
        lines.append(f"  {field or '(rule)'}: {msg}{shown}")
    return f"invalid {what}:\n" + "\n".join(lines)


def _entries(raw: Any, where: str) -> list[tuple[dict[str, Any], str]]:
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: rules must be a list")
    out: list[tuple[dict[str, Any], str]] = []
    names: set[str] = set()
    for i, entry in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"invalid rule at {at}: must be a mapping")
        name = entry.get("name")
        if not isinstance(name, str):
            raise ConfigError(f"invalid rule at {at}:\n  name: Field required")
        if name in names:
            raise ConfigError(f"invalid {_describe(entry, at)}:\n  name: defined twice in {where}")
        names.add(name)
        out.append((entry, at))
    return out


def read_rules_file(path: Path) -> list[tuple[dict[str, Any], str]]:
    data = read_yaml_mapping(path, "rules file", field="policy.rules_file")
    unknown = set(data) - {"rules"}
    if unknown:
        raise ConfigError(f"rules file {path}: unknown top-level keys {sorted(unknown)} (expected 'rules')")
    return _entries(data.get("rules", []), f"{path}: rules")


def resolve_rules(
    *,
    inline: Sequence[Mapping[str, Any]] = (),
    rules_file: Path | None = None,
    builtin: bool = True,
    health: HealthPolicy,
) -> tuple[RuleConfig, ...]:
    """Built-ins, then the rules file, then inline rules from config; later entries with the
    same name are merged over earlier ones key by key. Disabled rules are left out."""
    merged: dict[str, tuple[dict[str, Any], str]] = {}
    sources: list[Iterable[tuple[dict[str, Any], str]]] = []
    if builtin:
        sources.append((r, "built-in") for r in builtin_rules(health))
    if rules_file is not None:
        sources.append(read_rules_file(rules_file))
    if inline:
        sources.append(_entries(list(inline), "policy.rules"))
    builtins = {r["name"] for r in builtin_rules(health)} if builtin else set()
    for source in sources:
        for entry, where in source:
            judged = [k for k in JUDGEMENT_KEYS if k in entry]
            if where != "built-in" and entry["name"] in builtins and judged:
                raise ConfigError(
                    f"invalid {_describe(entry, where)}:\n  {judged[0]}: a built-in rule judges a GPU as the "
                    "exporters do, from policy.health (the chart's `health` value): change it there, "
                    "or add a rule of your own under another name"
                )
            base, _ = merged.get(entry["name"], ({}, where))
            merged[entry["name"]] = ({**base, **entry}, where)
    rules: list[RuleConfig] = []
    for entry, where in merged.values():
        try:
            rule = RuleConfig.model_validate(entry)
        except ValidationError as e:
            raise ConfigError(_validation_message(e, _describe(entry, where))) from None
        if rule.enabled:
            rules.append(rule)
    return tuple(rules)
