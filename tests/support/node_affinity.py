"""Which nodes a pod template may run on, by its nodeSelector and required node affinity, as the scheduler and the
DaemonSet controller decide it (tests cannot run either).

Follows kubernetes/api core/v1/types.go (@10b39a3: NodeSelector terms are ORed, a term's requirements ANDed, a
null or empty term matches no objects; matchFields knows metadata.name only) and the label requirement semantics of
kubernetes/apimachinery pkg/labels/selector.go Requirement.Matches (@eed236c): In needs the label with one of the
values, NotIn matches a node without the label, Gt/Lt compare the label and the one value as int64. Preferred
affinity does not decide where a pod may run and is ignored, as are taints (a DaemonSet's tolerations are checked
apart from this).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _int(text: str) -> int | None:
    try:
        value = int(text, 10)
    except ValueError:
        return None
    return value if -(2**63) <= value < 2**63 else None


def requirement_matches(requirement: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator, values = requirement["key"], requirement["operator"], requirement.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt"):
        if key not in labels or len(values) != 1:
            return False
        have, want = _int(labels[key]), _int(values[0])
        if have is None or want is None:
            return False
        return have > want if operator == "Gt" else have < want
    raise ValueError(f"unknown node selector operator {operator!r}")


def term_matches(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False
    for field in fields:
        if field["key"] != "metadata.name":
            raise ValueError(f"unsupported field selector key {field['key']!r}")
    return all(requirement_matches(r, labels) for r in expressions) and all(
        requirement_matches(f, {"metadata.name": name}) for f in fields
    )


def pod_fits(pod_spec: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    """Whether a pod with this spec may run on the node ``name`` with ``labels``."""
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    return any(term_matches(t, name, labels) for t in required.get("nodeSelectorTerms") or [])
