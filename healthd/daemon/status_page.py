"""The status page at / on the metrics port: the node at a glance for a person, as one small HTML page.

No scripts, no external assets (it must work on an air-gapped node and through a port-forward); it refreshes
itself every 10 s. Card data comes from the Snapshot; health checks and active faults from the fault engine,
partitions from the partition manager, each read through a callable so that a section whose source is missing (or
failed) says so instead of showing an empty table. exporter/http.py serves the result as its landing page.

The page judges nothing itself: what it calls a problem is a card that does not answer, a health check the
daemon's probes report as failed or warning (their thresholds are in ``[health.*]``), or an active fault of
severity warning or worse. The card values (memory, ECC counts, links up) are shown as data; without checks and
faults only an unanswering card is flagged.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import structlog

from exporter.attribution.attributor import Attribution
from exporter.backends.types import DeviceInfo, DeviceSample, LinkState, Unsupported
from exporter.health import Level, NodeStatus
from exporter.snapshot import GpuSnapshot, Snapshot
from healthd.daemon.runbooks import AlertRunbook, runbook_for, runbook_link, runbooks_section
from healthd.daemon.status_hook import HookView, hook_cell, hook_problems, latest
from healthd.faults.engine import CheckState
from healthd.faults.fault import Fault
from healthd.findings import Action, CheckResult, CheckStatus, GpuRef, Severity
from healthd.partition.model import PartitionRecord

log = structlog.get_logger("status_page")
T = TypeVar("T")
MAX_PODS_SHOWN = 4  # per card; the rest are counted


@dataclass(frozen=True, slots=True)
class Problem:
    level: str  # "bad" or "warn"
    text: str
    title: str = ""  # the longer text a pointer over the pill shows


# A check status -> the pill it gets; anything else (ok, unknown, unsupported) is not a problem.
CHECK_LEVELS = {CheckStatus.FAILED: "bad", CheckStatus.WARNING: "warn"}


def fault_level(severity: Severity) -> str | None:
    """Critical and fatal faults are bad, warnings warn; an info fault is listed in the fault table only."""
    if severity >= Severity.CRITICAL:
        return "bad"
    return "warn" if severity is Severity.WARNING else None


def _index(gpu: GpuRef | None) -> int | None:
    return None if gpu is None else gpu.index


def data_problems(gpu: GpuSnapshot) -> list[Problem]:
    """What the data shows without any threshold: the card does not answer, or has not been sampled yet."""
    if not gpu.fresh:
        return [Problem("bad", f"not answering ({gpu.error_code or 'error'}): {gpu.error or ''}".rstrip(": "))]
    if gpu.sample is None:
        return [Problem("warn", "no sample yet")]
    return []


def check_problem(state: CheckState) -> Problem | None:
    r = state.result
    level = CHECK_LEVELS.get(r.status)
    if level is None:
        return None
    return Problem(level, f"{r.check}: {r.detail}" if r.detail else f"{r.check} {r.status}")


def fault_problem(fault: Fault) -> Problem | None:
    level = fault_level(fault.severity)
    if level is None:
        return None
    action = f" ({fault.action.label})" if fault.action is not Action.NONE else ""
    return Problem(level, f"fault {fault.code}{action}", f"{fault.severity.name.lower()}: {fault.message}")


def card_problems(gpu: GpuSnapshot, checks: Sequence[CheckState] = (), faults: Sequence[Fault] = ()) -> list[Problem]:
    """What the state cell of ``gpu`` shows: the data's own facts, then the probes' failed and warning checks for
    this card (failed first), then its active faults."""
    found = [p for s in checks if _index(s.result.gpu) == gpu.index and (p := check_problem(s)) is not None]
    found.sort(key=lambda p: p.level != "bad")
    found += [p for f in faults if _index(f.gpu) == gpu.index and (p := fault_problem(f)) is not None]
    return data_problems(gpu) + found


CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:12px 20px;display:flex;gap:24px;align-items:baseline;flex-wrap:wrap}
header h1{font-size:18px;margin:0}header a{color:#9cc3ff}main{padding:12px 20px}
.banner{padding:10px 14px;border-radius:6px;margin:8px 0 14px;font-weight:600}
.ok{background:#dff3e4;color:#17602b}.warn{background:#fff1d6;color:#7a4b00}.bad{background:#fbe0e0;color:#8a1414}
.muted{color:#6b7280}table{border-collapse:collapse;width:100%;background:#fff;margin-bottom:18px}
th,td{border-bottom:1px solid #e5e7eb;padding:5px 8px;text-align:left;vertical-align:top;white-space:nowrap}
th{background:#eef0f4;font-weight:600}td.wrap{white-space:normal}h2{font-size:15px;margin:16px 0 6px}
td.state{white-space:normal;min-width:12em;max-width:28em}.scroll{overflow-x:auto;margin-bottom:18px}
.scroll table{margin-bottom:0}@media (max-width:1100px){th,td{padding:4px 5px}body{font-size:13px}}
tr.bad-row td{background:#fff5f5}tr.warn-row td{background:#fffaf0}
.pill{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;margin:1px 3px 1px 0}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _opt(value: object, fmt: str) -> str:
    if value is None or isinstance(value, Unsupported):
        return "&ndash;"
    return _e(fmt.format(value))


def _ecc_counts(s: DeviceSample) -> str:
    ecc = s.ecc
    if ecc.enabled_current is not True:
        return "off" if ecc.enabled_current is False else "&ndash;"
    return f"{_opt(ecc.uncorrected_volatile, '{}')} / {_opt(ecc.corrected_volatile, '{}')}"


def _pill(p: Problem) -> str:
    title = f' title="{_e(p.title)}"' if p.title else ""
    return f'<span class="pill {p.level}"{title}>{_e(p.text)}</span>'


def pods_by_gpu(attribution: Attribution | None) -> dict[int, list[str]]:
    """namespace/pod of every pod on each card: those kubelet allocated it and those whose processes run on it."""
    if attribution is None:
        return {}
    found: dict[int, set[str]] = {}
    for a in attribution.allocations:
        found.setdefault(a.gpu, set()).add(f"{a.namespace}/{a.pod}")
    for p in attribution.processes:
        if p.workload.pod:
            found.setdefault(p.gpu, set()).add(f"{p.workload.namespace}/{p.workload.pod}")
    return {gpu: sorted(pods) for gpu, pods in found.items()}


def _identity(info: DeviceInfo | None) -> str:
    """Model, then the PCI bus id and serial a technician finds the card by, and the full UUID on hover."""
    if info is None:
        return "?"
    serial = "" if isinstance(info.serial, Unsupported) else info.serial
    ident = f"{info.pci_bus_id} · S/N {serial}" if serial else info.pci_bus_id
    return f'{_e(info.name)}<br><span class="muted" title="{_e(info.uuid)}">{_e(ident)}</span>'


def _pods_cell(pods: Sequence[str]) -> str:
    if not pods:
        return '<td class="wrap muted">&ndash;</td>'
    shown = ", ".join(_e(p) for p in pods[:MAX_PODS_SHOWN])
    more = f" and {len(pods) - MAX_PODS_SHOWN} more" if len(pods) > MAX_PODS_SHOWN else ""
    return f'<td class="wrap">{shown}{more}</td>'


def _gpu_rows(snapshot: Snapshot, problems: dict[int, list[Problem]], pods: dict[int, list[str]]) -> str:
    rows = []
    for gpu in snapshot.gpus:
        info, s = gpu.info, gpu.sample
        found = problems.get(gpu.index, [])
        level = _worst(found)
        state = "".join(_pill(p) for p in found) or '<span class="pill ok">ok</span>'
        if s is None or not gpu.fresh:
            values = '<td colspan="7" class="muted">no current values</td>'
        else:
            total = info.memory_total_bytes if info else 0
            mem = f"{s.memory_used_bytes / 2**30:.0f} / {total / 2**30:.0f} GiB"
            links = "&ndash;"
            if not isinstance(s.nvlinks, Unsupported) and s.nvlinks:
                up = sum(1 for link in s.nvlinks if link.state is LinkState.UP)
                links = f"{up}/{len(s.nvlinks)}"
            mig = "on" if s.mig_mode_current is True else "off"
            if gpu.mig_instances:
                mig += " (" + ", ".join(_e(m.profile_name) for m in gpu.mig_instances) + ")"
            util = s.gpu_utilization_ratio
            values = (
                f"<td>{_opt(None if isinstance(util, Unsupported) else util * 100, '{:.0f} %')}</td>"
                f"<td>{_e(mem)}</td><td>{_opt(s.temperature_gpu_celsius, '{:.0f} °C')}</td>"
                f"<td>{_opt(s.power_draw_watts, '{:.0f}')} / {_opt(s.power_limit_watts, '{:.0f} W')}</td>"
                f"<td>{_ecc_counts(s)}</td><td>{links}</td><td>{mig}</td>"
            )
        rows.append(
            f'<tr class="{level}-row"><td>{gpu.index}</td><td>{_identity(info)}</td>'
            f'<td class="state">{state}</td>{values}{_pods_cell(pods.get(gpu.index, []))}</tr>'
        )
    head = (
        "<tr><th>GPU</th><th>model, PCI bus id, serial</th><th>state</th><th>util</th><th>memory</th><th>temp</th>"
        "<th>power</th>"
        '<th title="volatile ECC errors since the last GPU reset: uncorrectable / correctable">ECC unc / corr</th>'
        "<th>NVLink up</th><th>MIG</th><th>pods</th></tr>"
    )
    return f'<div class="scroll"><table>{head}{"".join(rows)}</table></div>'


def _worst(problems: Sequence[Problem]) -> str:
    return "bad" if any(p.level == "bad" for p in problems) else "warn" if problems else "ok"


def _section(title: str, rows: Sequence[T] | None, note: str, render: Callable[[Sequence[T]], str]) -> str:
    if rows is None:
        return f'<h2>{_e(title)}</h2><p class="muted">{_e(note)}</p>'
    if not rows:
        return f'<h2>{_e(title)}</h2><p class="muted">None.</p>'
    return f"<h2>{_e(title)}</h2>{render(rows)}"


def _gpu_text(gpu: int | None) -> str:
    return "node" if gpu is None else str(gpu)


def xid_results(results: Sequence[CheckResult], active: Sequence[Fault]) -> list[CheckResult]:
    """An xid row for the check table, as `xpuctl health` makes it: XIDs are events, not a check run every cycle,
    so each card's state comes from its active XID faults (failed for critical or fatal, warning below, ok without)."""
    if any(r.check == "xid" for r in results):
        return []
    cards = {r.gpu.index: r.gpu for r in results if r.gpu is not None}
    xids = [f for f in active if f.check == "xid" and f.gpu is not None]
    cards.update({f.gpu.index: f.gpu for f in xids if f.gpu is not None})
    out = []
    for index, ref in sorted(cards.items()):
        found = sorted((f for f in xids if f.gpu is not None and f.gpu.index == index), key=lambda f: -f.severity)
        if not found:
            out.append(CheckResult("xid", ref, CheckStatus.OK))
            continue
        status = CheckStatus.FAILED if found[0].severity >= Severity.CRITICAL else CheckStatus.WARNING
        out.append(CheckResult("xid", ref, status, "; ".join(f"{f.code}: {f.message}" for f in found)))
    return out


def _checks_table(states: Sequence[CheckState], active: Sequence[Fault] = ()) -> str:
    rows = [s.result for s in states]
    rows += xid_results(rows, active)
    checks = sorted({r.check for r in rows})
    gpus = sorted({_index(r.gpu) for r in rows}, key=lambda g: -1 if g is None else g)
    cell = {(r.check, _index(r.gpu)): r for r in rows}
    level = {CheckStatus.OK: "ok", **CHECK_LEVELS}
    head = "<tr><th>check</th>" + "".join(f"<th>{'node' if g is None else f'GPU {g}'}</th>" for g in gpus) + "</tr>"
    body = []
    for check in checks:
        tds = []
        for g in gpus:
            r = cell.get((check, g))
            if r is None:
                tds.append("<td></td>")
            else:
                title = f' title="{_e(r.detail)}"' if r.detail else ""
                tds.append(f'<td{title}><span class="pill {level.get(r.status, "muted")}">{_e(r.status)}</span></td>')
        body.append(f"<tr><td>{_e(check)}</td>{''.join(tds)}</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _faults_table(faults: Sequence[Fault], now: float, hook: HookView | None, runbooks: Sequence[AlertRunbook]) -> str:
    by_fault = latest(hook.deliveries()) if hook is not None else {}
    body = []
    for f in faults:
        hook_td = f"<td>{hook_cell(f, hook, by_fault)}</td>" if hook is not None else ""
        found = runbook_for(f.code, f.action.label, runbooks)
        hook_td += f"<td>{runbook_link(found) if found else '&ndash;'}</td>"
        age = max(0.0, now - f.first_seen)
        severity = f.severity.name.lower()
        body.append(
            f'<tr><td><span class="pill {fault_level(f.severity) or "muted"}">{_e(severity)}</span></td>'
            f"<td>{_e(f.code)}</td><td>{_e(_gpu_text(_index(f.gpu)))}</td><td><b>{_e(f.action.label)}</b></td>"
            f'<td class="wrap">{_e(f.message)}</td><td>{age:.0f} s ago</td>{hook_td}</tr>'
        )
    hook_th = '<th title="the replacement hook: delivered, pending or failing">hook</th>' if hook else ""
    head = (
        "<tr><th>severity</th><th>code</th><th>GPU</th><th>action</th><th>message</th><th>since</th>"
        f"{hook_th}<th>runbook</th></tr>"
    )
    return f"<table>{head}{''.join(body)}</table>"


def _partition_detail(p: PartitionRecord) -> str:
    """Quotas, or the MIG profile and where it sits."""
    if p.mig is not None:
        return f"MIG {p.mig.profile_name} at slice {p.mig.placement_start}"
    compute = f"{p.compute_percent}%" if p.compute_percent else "no compute limit"
    return f"{compute}, {p.memory_mib} MiB" if p.memory_mib else compute


def _partitions_table(partitions: Sequence[PartitionRecord]) -> str:
    body = [
        f"<tr><td>{_e(p.id)}</td><td>{p.gpu}</td><td>{_e(p.mode)}</td><td>{_e(p.owner.describe())}</td>"
        f'<td class="wrap">{_e(_partition_detail(p))}</td></tr>'
        for p in partitions
    ]
    head = "<tr><th>partition</th><th>GPU</th><th>mode</th><th>owner</th><th>detail</th></tr>"
    return f"<table>{head}{''.join(body)}</table>"


def _call(name: str, source: Callable[[], Iterable[T]] | None) -> tuple[list[T] | None, str]:
    """What a source returns, or None and why not: none in this build, or it raised (the page still renders)."""
    if source is None:
        return None, "Not available in this build."
    try:
        return list(source()), ""
    except Exception as exc:
        log.exception("status page: a source failed", section=name)
        return None, f"Not available: reading them failed ({type(exc).__name__}: {exc})."


def _banner(
    snapshot: Snapshot,
    problems: dict[int, list[Problem]],
    checks: Sequence[CheckState] | None,
    faults: Sequence[Fault] | None,
) -> tuple[str, str]:
    """The banner's level and text from the same problems the GPU rows show, node-wide checks and active faults."""
    if not snapshot.backend_up:
        return "bad", f"GPU driver library not usable: {snapshot.backend_error}"
    bad = [i for i, found in problems.items() if _worst(found) == "bad"]
    warn = [i for i, found in problems.items() if _worst(found) == "warn"]
    node = [p for s in checks or () if s.result.gpu is None and (p := check_problem(s)) is not None]
    fault_levels = [level for f in faults or () if (level := fault_level(f.severity)) is not None]
    parts = [f"{_gpus(bad)} need{'s' if len(bad) == 1 else ''} attention"] if bad else []
    parts += [f"{_gpus(warn)}: warnings"] if warn else []
    parts += [f"node: {p.text}" for p in node]
    levels = [*(["bad"] if bad else []), *(["warn"] if warn else []), *(p.level for p in node), *fault_levels]
    level = _worst([Problem(lv, "") for lv in levels])
    if parts or level != "ok":
        text = "; ".join(parts)
    elif checks is None:
        text = f"All {len(snapshot.gpus)} GPUs answering; no health checks in this build"
    elif not checks:
        text = f"All {len(snapshot.gpus)} GPUs answering; the health checks have not run yet"
    else:
        text = f"All {len(snapshot.gpus)} GPUs answering, no problems seen"
    if faults:
        text = "; ".join(filter(None, [text, f"{len(faults)} active fault{'s' if len(faults) != 1 else ''}"]))
    return level, text


def render_status_page(
    snapshot: Snapshot | None,
    now: float | None = None,
    *,
    checks: Callable[[], Iterable[CheckState]] | None = None,
    faults: Callable[[], Iterable[Fault]] | None = None,
    partitions: Callable[[], Iterable[PartitionRecord]] | None = None,
    hostname: str = "",
    version: str = "",
    node: NodeStatus | None = None,
    attribution: Callable[[], Attribution | None] | None = None,
    hook: HookView | None = None,
    runbooks: Sequence[AlertRunbook] = (),
) -> str:
    """``checks`` and ``faults`` are the fault engine's, ``partitions`` the partition manager's, ``attribution``
    who runs on each card; None: not in this build (the section says so)."""
    now = time.time() if now is None else now
    title = f"xpu-healthd {hostname}".strip()
    header = (
        f"<header><h1>{_e(title)}</h1>"
        f'<span><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a></span>'
    )
    if snapshot is None:
        return _page(title, header + "</header><main><p>No sample yet.</p></main>")
    driver = snapshot.system.driver_version if snapshot.system else "?"
    header += (
        f"<span>{len(snapshot.gpus)} GPUs &middot; driver {_e(driver)} &middot; {_e(snapshot.backend_name)}"
        f"{' &middot; ' + _e(version) if version else ''} &middot; data {now - snapshot.taken_at:.1f} s old</span>"
        "</header>"
    )
    active, faults_note = _call("faults", faults)
    states, checks_note = _call("checks", checks)
    records, partitions_note = _call("partitions", partitions)
    problems = {g.index: card_problems(g, states or (), active or ()) for g in snapshot.gpus}
    banner = _banner(snapshot, problems, states, active)
    stuck = [g.index for g in snapshot.gpus if not g.fresh]
    if node is not None and not node.serving:
        banner = ("bad", node.summary)
    elif node is not None and node.level is Level.DEGRADED:
        banner = ("bad" if banner[0] == "bad" else "warn", f"{banner[1]}. {node.summary}")
    elif stuck:
        banner = (banner[0], banner[1] + f" ({len(stuck)} not answering)")
    if hook is not None and active:
        extra = _hook_problems(active, hook)
        if extra:
            level = _worst([Problem(banner[0], ""), *(Problem(lv, "") for lv, _ in extra)])
            banner = (level if level != "ok" else banner[0], "; ".join([banner[1], *(text for _, text in extra)]))
    body = (
        f'<main><div class="banner {banner[0]}">{_e(banner[1])}</div>'
        f"<h2>GPUs</h2>{_gpu_rows(snapshot, problems, _pods(attribution))}"
        + _section("Active faults", active, faults_note, lambda rows: _faults_table(rows, now, hook, runbooks))
        + _section("Health checks", states, checks_note, lambda rows: _checks_table(rows, active or ()))
        + _section("Partitions", records, partitions_note, _partitions_table)
        + runbooks_section(_linked(active or (), runbooks))
        + "</main>"
    )
    return _page(title, header + body)


def _linked(active: Sequence[Fault], runbooks: Sequence[AlertRunbook]) -> list[AlertRunbook]:
    found = (runbook_for(f.code, f.action.label, runbooks) for f in active)
    return sorted({a.alert: a for a in found if a is not None}.values(), key=lambda a: a.alert)


def _hook_problems(active: Sequence[Fault], hook: HookView) -> list[tuple[str, str]]:
    try:
        return hook_problems(active, hook)
    except Exception:
        log.exception("status page: a source failed", section="hook")
        return [("warn", "the hook's delivery state could not be read")]


def _pods(source: Callable[[], Attribution | None] | None) -> dict[int, list[str]]:
    if source is None:
        return {}
    try:
        return pods_by_gpu(source())
    except Exception:
        log.exception("status page: a source failed", section="pods")
        return {}


def _gpus(indexes: Sequence[int]) -> str:
    return ("GPU " if len(indexes) == 1 else "GPUs ") + ", ".join(map(str, indexes))


def _page(title: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="refresh" content="10"><meta name="viewport" content="width=device-width">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>{body}</body></html>\n"
    )
