"""The status page's view of the replacement hook: whether each active fault was handed to it, and whether the
hook is failing (and why), from what the hook dispatcher last read of its outbox."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from healthd.faults.fault import Fault, HookDelivery
from healthd.findings import Action

STATE_LEVEL = {"delivered": "ok", "pending": "warn", "failing": "bad"}


@dataclass(frozen=True, slots=True)
class HookView:
    """The hook as configured ([hook] endpoints and min_action) and the deliveries the dispatcher knows."""

    endpoints: tuple[str, ...]
    min_action: Action
    deliveries: Callable[[], Sequence[HookDelivery]]


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _pill(level: str, text: str, title: str = "") -> str:
    hover = f' title="{_e(title)}"' if title else ""
    return f'<span class="pill {level}"{hover}>{_e(text)}</span>'


def latest(deliveries: Sequence[HookDelivery]) -> dict[str, list[HookDelivery]]:
    """Fault id -> its delivery to each target."""
    out: dict[str, list[HookDelivery]] = {}
    for d in deliveries:
        out.setdefault(d.fault_id, []).append(d)
    return out


def hook_cell(fault: Fault, view: HookView, by_fault: dict[str, list[HookDelivery]]) -> str:
    """The faults table's hook cell: not sent (below min_action), no hook configured, or each target's state."""
    if fault.action < view.min_action:
        return f'<span class="muted" title="below [hook] min_action {view.min_action.label}">not for the hook</span>'
    if not view.endpoints:
        return _pill("warn", "no hook configured", "[hook] endpoints is empty: this fault reaches no replacement hook")
    found = by_fault.get(fault.id, [])
    if not found:
        return '<span class="muted" title="queued before the hook was configured, or not read yet">not queued</span>'
    pills = []
    for d in found:
        target = f"{d.target}: " if len(view.endpoints) > 1 else ""
        tries = f" ({d.attempts} failed tries)" if d.attempts and d.state != "delivered" else ""
        pills.append(_pill(STATE_LEVEL[d.state], f"{target}{d.state}{tries}", d.last_error))
    return "".join(pills)


def hook_problems(active: Sequence[Fault], view: HookView) -> list[tuple[str, str]]:
    """(level, text) for the banner: a hook that is failing, with its last error, or faults meant for a hook when
    there is none."""
    by_fault = latest(view.deliveries())
    problems = []
    meant = [f for f in active if f.action >= view.min_action]
    if meant and not view.endpoints:
        problems.append(("warn", f"no hook configured: {len(meant)} {view.min_action.label} fault(s) reach no one"))
    failing = [d for f in meant for d in by_fault.get(f.id, []) if d.state == "failing"]
    problems += [("bad", f"hook {d.target} failing for {d.fault_id}: {d.last_error}") for d in failing[:3]]
    return problems
