"""Kubernetes label selectors: the frozen value, its JSON form and its string grammar. Pure.

Below the config layer (a pool's ``node_selector`` is checked when config loads) and the
controller (PDBs, pools).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class LabelSelector:
    match_labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    expressions: tuple[Requirement, ...] = ()
    # A PDB with a null selector selects nothing; an empty one selects every pod.
    null: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.null:
            return False
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for r in self.expressions:
            present = r.key in labels
            ok = {
                "In": present and labels.get(r.key) in r.values,
                "NotIn": not present or labels.get(r.key) not in r.values,
                "Exists": present,
                "DoesNotExist": not present,
            }.get(r.operator, False)
            if not ok:
                return False
        return True

    @staticmethod
    def from_json(obj: Mapping[str, Any] | None) -> LabelSelector:
        if obj is None:
            return LabelSelector(null=True)
        return LabelSelector(
            match_labels=MappingProxyType(dict(obj.get("matchLabels") or {})),
            expressions=tuple(
                Requirement(str(e.get("key")), str(e.get("operator")), frozenset(e.get("values") or ()))
                for e in obj.get("matchExpressions") or ()
            ),
        )


_SET_TERM = re.compile(r"^([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)$")
_KEY = re.compile(r"^[^\s!=(),]+$")
_EQUALITY_TERM = re.compile(r"^([^\s!=(),]+)\s*(==|!=|=)\s*([^\s!=(),]*)$")


def parse_selector(text: str) -> LabelSelector:
    """A label selector string (``a=b,c!=d,e in (f,g),f notin (h),!i,j``) as a
    :class:`LabelSelector`; raises ValueError naming the bad term."""
    labels: dict[str, str] = {}
    expressions: list[Requirement] = []
    for raw in re.split(r",(?![^(]*\))", text):
        term = raw.strip()
        if m := _SET_TERM.match(term):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            expressions.append(Requirement(m.group(1), "In" if m.group(2) == "in" else "NotIn", values))
            continue
        m = _EQUALITY_TERM.match(term)
        if m and m.group(2) == "!=":
            expressions.append(Requirement(m.group(1), "NotIn", frozenset({m.group(3)})))
        elif m:
            labels[m.group(1)] = m.group(3)
        elif term.startswith("!") and _KEY.match(term[1:].strip()):
            expressions.append(Requirement(term[1:].strip(), "DoesNotExist"))
        elif _KEY.match(term):
            expressions.append(Requirement(term, "Exists"))
        else:
            raise ValueError(f"bad selector term {term!r}")
    return LabelSelector(MappingProxyType(labels), tuple(expressions))
