"""Whether one claim's device requests can be met by one node's published devices, and by which: a check for
example claims, not kube-scheduler's allocator (which also weighs other claims' allocations, other nodes, device
taints and admin access, and searches across requests).

Semantics from kubernetes/api resource/v1/types.go (@10b39a3): a request's devices must match its DeviceClass's
selectors and its own (CEL: tests/support/dra_cel.py); ``count`` devices are allocated (allocationMode ExactCount,
the default); ``firstAvailable`` tries its subrequests in order and takes the first that can be met; a constraint
applies to the requests (``<request>`` or ``<request>/<subrequest>``) it names, and ``matchAttribute`` needs every
device to have the attribute with one value. CapacityRequirements: a requested amount must be available on the
device (compareTo >= 0); with a request policy it is rounded up to ``validRange.min``, then to ``min + n * step``,
or to the next of ``validValues``, and a device whose policy cannot take it (above ``max`` or every valid value) is
not eligible; a capacity not requested consumes the policy's default, or all of it without a policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from tests.support import k8s_cel_values as values
from tests.support.dra_cel import Selector, class_selects


@dataclass(frozen=True)
class Allocation:
    request: str  # the request, or request/subrequest of a firstAvailable
    devices: tuple[str, ...]
    consumed: tuple[Mapping[str, Fraction], ...]  # per device, for capacities the request consumes


def _qty(text: str) -> Fraction:
    return values.parse_quantity(str(text))


def policy_amount(capacity: Mapping[str, Any], requested: Fraction | None) -> Fraction | None:
    """What a request of ``requested`` (None: not requested) consumes of this capacity, None if not allowed."""
    total = _qty(capacity["value"])
    policy = capacity.get("requestPolicy")
    if policy is None:
        return total if requested is None or requested <= total else None
    if requested is None:
        return _qty(policy["default"]) if "default" in policy else total
    amount = requested
    if valid := policy.get("validValues"):
        fits = [v for v in map(_qty, valid) if v >= amount]
        amount = min(fits) if fits else None
    elif valid_range := policy.get("validRange"):
        low = _qty(valid_range["min"])
        amount = max(amount, low)
        if "step" in valid_range:
            step = _qty(valid_range["step"])
            amount = low + math.ceil((amount - low) / step) * step
        if "max" in valid_range and amount > _qty(valid_range["max"]):
            amount = None
    return amount if amount is not None and amount <= total else None


def consumed(device: Mapping[str, Any], requests: Mapping[str, str]) -> dict[str, Fraction] | None:
    """The capacity one allocation of this device consumes, None when the device cannot meet the requests."""
    capacity = device.get("capacity") or {}
    if any(name not in capacity for name in requests):
        return None
    out = {}
    for name, cap in capacity.items():
        amount = policy_amount(cap, _qty(requests[name]) if name in requests else None)
        if amount is None:
            return None
        out[name] = amount
    return out


def _attribute(device: Mapping[str, Any], name: str, driver: str) -> Any:
    attrs = device.get("attributes") or {}
    domain, _, ident = name.rpartition("/")
    value = attrs.get(name) if domain != driver else attrs.get(ident, attrs.get(name))
    return None if value is None else tuple(sorted(value.items()))


def _candidates(
    exact: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], slices: Sequence[Mapping[str, Any]]
) -> list[tuple[str, Mapping[str, Any], dict[str, Fraction]]]:
    device_class = classes[exact["deviceClassName"]]
    selectors = [Selector(s["cel"]["expression"]) for s in exact.get("selectors") or []]
    requests = (exact.get("capacity") or {}).get("requests") or {}
    out = []
    for s in slices:
        driver = s["spec"]["driver"]
        for device in s["spec"].get("devices") or []:
            if not class_selects(device_class, driver, device):
                continue
            if not all(sel.matches(driver, device) for sel in selectors):
                continue
            if (amounts := consumed(device, requests)) is not None:
                out.append((driver, device, amounts))
    return out


def _pick(
    name: str,
    exact: Mapping[str, Any],
    match: Sequence[str],
    classes: Mapping[str, Mapping[str, Any]],
    slices: Sequence[Mapping[str, Any]],
) -> Allocation | None:
    count = int(exact.get("count", 1))
    candidates = _candidates(exact, classes, slices)
    groups: dict[tuple[Any, ...], list[tuple[str, Mapping[str, Any], dict[str, Fraction]]]] = {(): candidates}
    if match:
        groups = {}
        for c in candidates:
            key = tuple(_attribute(c[1], a, c[0]) for a in match)
            if None not in key:
                groups.setdefault(key, []).append(c)
    for key in sorted(groups, key=repr):
        group = groups[key]
        if len(group) >= count:
            chosen = group[:count]
            return Allocation(name, tuple(c[1]["name"] for c in chosen), tuple(c[2] for c in chosen))
    return None


def allocate(
    claim_spec: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], slices: Sequence[Mapping[str, Any]]
) -> dict[str, Allocation | None]:
    """Per request of the claim: its allocation, or None when these devices cannot meet it. A constraint across
    several requests is checked per request (each must have the attribute); their common value is not searched."""
    devices = claim_spec["devices"]
    constraints = devices.get("constraints") or []

    def matching(name: str) -> list[str]:
        main = name.split("/")[0]
        return [
            c["matchAttribute"]
            for c in constraints
            if "matchAttribute" in c and (name in c["requests"] or main in c["requests"])
        ]

    out: dict[str, Allocation | None] = {}
    for request in devices["requests"]:
        if "exactly" in request:
            out[request["name"]] = _pick(
                request["name"], request["exactly"], matching(request["name"]), classes, slices
            )
            continue
        out[request["name"]] = None
        for sub in request["firstAvailable"]:
            name = f"{request['name']}/{sub['name']}"
            if (found := _pick(name, sub, matching(name), classes, slices)) is not None:
                out[request["name"]] = found
                break
    return out
