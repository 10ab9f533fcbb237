# ruff: noqa: E501  (panel definitions read best one per line)
"""Write the Grafana dashboards (dashboards/*.json) from the panel lists below.

Run ``python3 dashboards/build.py`` after changing a panel; tests/dashboards/test_dashboards.py fails when the JSON files are
out of date. Panels use the ``$datasource`` variable (any Prometheus), ``$node`` (the scrape ``instance``) and,
where it makes sense, ``$gpu``; every panel has a unit, and the ones that show health have thresholds.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
N = 'instance=~"$node"'
NG = 'instance=~"$node", gpu=~"$gpu"'
RI = "$__rate_interval"

GREEN, ORANGE, RED, BLUE = "green", "orange", "red", "blue"


def steps(*pairs: tuple[float | None, str]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in pairs]}


OK = steps((None, GREEN))
BAD_AT_1 = steps((None, GREEN), (1, RED))
WARN_AT_1 = steps((None, GREEN), (1, ORANGE))
TEMP = steps((None, GREEN), (80, ORANGE), (87, RED))
HBM_TEMP = steps((None, GREEN), (85, ORANGE), (95, RED))
SHARE = steps((None, GREEN), (0.9, ORANGE), (0.97, RED))


@dataclass
class Target:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass
class Panel:
    type: str  # timeseries, stat, table, state-timeline, bargauge
    title: str
    targets: list[Target]
    unit: str = "short"
    thresholds: dict[str, Any] = field(default_factory=lambda: OK)
    w: int = 12
    h: int = 8
    description: str = ""
    min: float | None = None
    max: float | None = None
    mappings: list[dict[str, Any]] = field(default_factory=list)
    stack: bool = False
    columns: dict[str, str] = field(default_factory=dict)  # table: "Value #A" -> header
    hidden: tuple[str, ...] = ()  # table: columns left out (besides Time, __name__, job)
    units: dict[str, str] = field(default_factory=dict)  # table: column -> unit, where it differs from ``unit``


def t(expr: str, legend: str = "") -> Target:
    return Target(expr, legend)


def instant(expr: str, legend: str = "") -> Target:
    return Target(expr, legend, instant=True)


def table(expr: str) -> Target:
    return Target(expr, instant=True, table=True)


def var_datasource() -> dict[str, Any]:
    return {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus", "hide": 0}


def var_query(name: str, label: str, query: str, *, multi: bool = True, all_value: str = ".*") -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"},
        "refresh": 2,
        "sort": 3,
        "multi": multi,
        "includeAll": multi,
        "hide": 0,
    }
    if multi:
        out["allValue"] = all_value
    return out


NODE_VAR = var_query("node", "Node", "label_values(xpu_gpus, instance)")
NODE_ONE = var_query("node", "Node", "label_values(xpu_gpus, instance)", multi=False)
GPU_VAR = var_query("gpu", "GPU", 'label_values(xpu_gpu_info{instance=~"$node"}, gpu)')


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": p.unit, "thresholds": p.thresholds, "mappings": p.mappings}
    if p.min is not None:
        defaults["min"] = p.min
    if p.max is not None:
        defaults["max"] = p.max
    options: dict[str, Any] = {}
    if p.type == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if p.stack else "none", "group": "A"},
            "thresholdsStyle": {"mode": "off" if p.thresholds is OK else "line"},
        }
        defaults["color"] = {"mode": "palette-classic"}
        options = {
            "legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif p.type == "stat":
        defaults["color"] = {"mode": "thresholds"}
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "auto",
        }
    elif p.type == "state-timeline":
        defaults["color"] = {"mode": "thresholds"}
        options = {"showValue": "never", "mergeValues": True, "rowHeight": 0.8, "legend": {"showLegend": False}}
    elif p.type == "bargauge":
        defaults["color"] = {"mode": "thresholds"}
        options = {
            "displayMode": "gradient",
            "orientation": "horizontal",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        }
    elif p.type == "table":
        defaults["custom"] = {"align": "auto", "cellOptions": {"type": "color-text"}}
        options = {"showHeader": True, "cellHeight": "sm"}
    targets = []
    for i, tg in enumerate(p.targets):
        target: dict[str, Any] = {
            "refId": chr(ord("A") + i),
            "datasource": DS,
            "expr": tg.expr,
            "legendFormat": tg.legend or "__auto",
            "range": not tg.instant,
            "instant": tg.instant,
        }
        if tg.table:
            target["format"] = "table"
        targets.append(target)
    panel: dict[str, Any] = {
        "id": pid,
        "type": p.type,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": p.h, "w": p.w, "x": x, "y": y},
        "fieldConfig": {
            "defaults": defaults,
            "overrides": [
                {"matcher": {"id": "byName", "options": column}, "properties": [{"id": "unit", "value": unit}]}
                for column, unit in p.units.items()
            ],
        },
        "options": options,
        "targets": targets,
    }
    if p.type == "table":
        panel["transformations"] = [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": dict.fromkeys(("Time", "__name__", "job", *p.hidden), True),
                    "renameByName": p.columns,
                },
            },
        ]
    return panel


def row(title: str) -> Panel:
    return Panel("row", title, [], w=24, h=1)


def layout(panels: list[Panel]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    x = y = row_h = 0
    for pid, p in enumerate(panels, start=1):
        if p.type == "row":
            if x:
                y += row_h
            out.append(
                {
                    "id": pid,
                    "type": "row",
                    "title": p.title,
                    "collapsed": False,
                    "panels": [],
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                }
            )
            x, y, row_h = 0, y + 1, 0
            continue
        if x + p.w > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(_panel_json(p, pid, x, y))
        x += p.w
        row_h = max(row_h, p.h)
    return out


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list[dict[str, Any]],
    panels: list[Panel],
    tags: tuple[str, ...] = (),
) -> dict[str, Any]:
    links = [
        {
            "title": "XPU dashboards",
            "type": "dashboards",
            "tags": ["xpu-runtime-kit"],
            "asDropdown": True,
            "includeVars": True,
            "keepTime": True,
            "icon": "external link",
            "tooltip": "The other xpu-runtime-kit dashboards, with this node and time range",
            "targetBlank": False,
            "url": "",
        }
    ]
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["xpu-runtime-kit", *tags],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "schemaVersion": 39,
        "version": 1,
        "links": links,
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": [var_datasource(), *variables]},
        "panels": layout(panels),
    }


RECOVERY = [
    {
        "type": "value",
        "options": {
            "0": {"text": "none", "color": GREEN},
            "1": {"text": "reset", "color": RED},
            "2": {"text": "reboot", "color": RED},
            "3": {"text": "drain P2P", "color": ORANGE},
            "4": {"text": "drain + reset", "color": RED},
            "5": {"text": "recover IMEX domain", "color": ORANGE},
            "6": {"text": "bus reset", "color": RED},
            "7": {"text": "system reboot", "color": RED},
            "-1": {"text": "unknown to this driver", "color": ORANGE},
        },
    }
]
UP_MAP = [
    {"type": "value", "options": {"0": {"text": "not answering", "color": RED}, "1": {"text": "ok", "color": GREEN}}}
]


def counted(counter: str, window: str = RI) -> str:
    """How much ``counter`` (a selector) grew in ``window``, including the series' first appearance.

    The daemon creates a counter series such as xpu_xid_errors_total{gpu, xid} at its first event, already at 1:
    there is no earlier 0 sample. increase() only measures growth between samples inside the window, so a card's
    first (and often only) XID 79 shows as 0. The left side takes series that exist now but did not one window ago
    (``unless ... offset``): everything they count happened inside the window, so their whole value is the increase.
    ``or`` falls back to increase() for every series that is older. (A daemon restart also starts series afresh;
    their value then counts since the restart, which is what happened in the window too.)
    """
    return f"(({counter} unless {counter} offset {window}) or increase({counter}[{window}]))"


def faults_per_card(where: str, *, instance: bool = False) -> Panel:
    """Which card has which fault, with its action and since when: one row per active fault (gpu empty: node-wide).

    "Since" is when the daemon first saw the fault (``xpu_fault_opened_timestamp_seconds``), exact and independent of
    the dashboard's time range; both queries carry the fault id, so each row is one fault.
    """
    active = f"xpu_faults_active{{{where}}} > 0"
    columns = {
        "gpu": "Card",
        "uuid": "UUID",
        "code": "Code",
        "action": "Action",
        "severity": "Severity",
        "fault_id": "Fault",
    }
    return Panel(
        "table",
        "Faults per card",
        [table(active), table(f"1000 * xpu_fault_opened_timestamp_seconds{{{where}}}")],
        w=24,
        h=8,
        description="Active faults of xpu-healthd, one row per fault; Card is empty for a node-wide fault, Fault is the "
        "daemon's fault id (`xpuctl faults show ID`, and the hook's idempotency key).",
        columns={**({"instance": "Node"} if instance else {}), **columns, "Value #B": "Since"},
        hidden=("Value #A", "node", *(() if instance else ("instance",))),
        units={"Value #B": "dateTimeAsIso"},
    )


FIRING_ALERTS = f'ALERTS{{alertstate="firing", alertname=~"Xpu.*", {N}}}'


def fleet() -> dict[str, Any]:
    panels = [
        row("At a glance"),
        Panel("stat", "Nodes reporting", [instant(f'count(up{{job="xpu-healthd", {N}}} == 1)')], w=4, h=4),
        Panel(
            "stat",
            "Nodes not scraped",
            [instant(f'count(up{{job="xpu-healthd", {N}}} == 0) or vector(0)')],
            thresholds=BAD_AT_1,
            w=4,
            h=4,
        ),
        Panel("stat", "GPUs", [instant(f"sum(xpu_gpus{{{N}}})")], w=4, h=4),
        Panel(
            "stat",
            "GPUs not answering",
            [instant(f"count(xpu_gpu_up{{{N}}} == 0) or vector(0)")],
            thresholds=BAD_AT_1,
            w=4,
            h=4,
        ),
        Panel(
            "stat",
            "Faults needing action",
            [instant(f'sum(xpu_faults_active{{{N}, action!="none"}}) or vector(0)')],
            thresholds=BAD_AT_1,
            w=4,
            h=4,
            description="Active faults whose action is not none (xpu-healthd).",
        ),
        Panel(
            "stat",
            "Firing XPU alerts",
            [instant(f"count({FIRING_ALERTS}) or vector(0)")],
            thresholds=WARN_AT_1,
            w=4,
            h=4,
        ),
        Panel(
            "table",
            "Nodes",
            [
                table(f"sum by (instance) (xpu_gpus{{{N}}})"),
                table(f"sum by (instance) (1 - xpu_gpu_up{{{N}}})"),
                table(f"avg by (instance) (xpu_gpu_utilization_ratio{{{N}}})"),
                table(f"sum by (instance) (xpu_gpu_power_watts{{{N}}})"),
                table(f"max by (instance) (xpu_gpu_temperature_celsius{{{N}}})"),
            ],
            w=24,
            h=8,
            columns={
                "Value #A": "GPUs",
                "Value #B": "GPUs not answering",
                "Value #C": "Utilization",
                "Value #D": "Power (W)",
                "Value #E": "Hottest die (°C)",
            },
        ),
        faults_per_card(N, instance=True),
        Panel("table", "Firing alerts", [table(FIRING_ALERTS)], w=24, h=8),
        row("GPUs"),
        Panel(
            "state-timeline",
            "GPU sampling state",
            [t(f"xpu_gpu_up{{{N}}}", "{{instance}} GPU {{gpu}}")],
            thresholds=steps((None, RED), (1, GREEN)),
            mappings=UP_MAP,
            w=24,
            h=10,
        ),
        Panel(
            "timeseries",
            "Utilization by node",
            [t(f"avg by (instance) (xpu_gpu_utilization_ratio{{{N}}})", "{{instance}}")],
            unit="percentunit",
            min=0,
            max=1,
        ),
        Panel(
            "timeseries",
            "Power by node",
            [t(f"sum by (instance) (xpu_gpu_power_watts{{{N}}})", "{{instance}}")],
            unit="watt",
            min=0,
        ),
        Panel(
            "timeseries",
            "Hottest GPU per node",
            [t(f"max by (instance) (xpu_gpu_temperature_celsius{{{N}}})", "{{instance}}")],
            unit="celsius",
            thresholds=TEMP,
        ),
        Panel(
            "timeseries",
            "Memory in use by node",
            [
                t(
                    f"sum by (instance) (xpu_gpu_memory_used_bytes{{{N}}}) / sum by (instance) (xpu_gpu_memory_total_bytes{{{N}}})",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
            min=0,
            max=1,
            thresholds=SHARE,
        ),
        row("Profiling (GPM)"),
        *fleet_profiling_panels(),
        row("Health"),
        Panel(
            "timeseries",
            "Active faults by action",
            [t(f"sum by (instance, gpu, action) (xpu_faults_active{{{N}}})", "{{instance}} GPU {{gpu}} {{action}}")],
            stack=True,
            thresholds=BAD_AT_1,
        ),
        Panel(
            "bargauge",
            "Checks not ok",
            [
                instant(
                    f'count by (check, status) (xpu_health_check_status{{{N}, status=~"warning|failed"}} == 1)',
                    "{{check}} {{status}}",
                )
            ],
            thresholds=WARN_AT_1,
        ),
        Panel(
            "timeseries",
            "Uncorrectable ECC errors (volatile) by node",
            [t(f'sum by (instance) (xpu_gpu_ecc_volatile_errors_total{{{N}, kind="uncorrected"}})', "{{instance}}")],
            thresholds=BAD_AT_1,
        ),
        Panel(
            "timeseries",
            "NVLinks down by node",
            [t(f"sum by (instance) (1 - xpu_gpu_nvlink_up{{{N}}})", "{{instance}}")],
            thresholds=BAD_AT_1,
            min=0,
        ),
    ]
    return dashboard(
        "xpu-fleet",
        "XPU / Fleet overview",
        "Every node and GPU at a glance: health, faults, load.",
        [NODE_VAR],
        panels,
        ("fleet",),
    )


# (title, card series, MIG series, what it measures): the profiling row of the node and fleet dashboards
PROFILING = (
    (
        "SM active",
        "xpu_gpu_sm_active_ratio",
        "xpu_mig_sm_active_ratio",
        "Share of SM cycles with at least one warp resident, over all SMs (GPM; DCGM SM_ACTIVE). Low with high GPU "
        "utilization: kernels too small to fill the card.",
    ),
    (
        "Tensor active",
        'xpu_gpu_tensor_active_ratio{pipe="any"}',
        'xpu_mig_tensor_active_ratio{pipe="any"}',
        "Share of cycles any tensor pipe was busy (GPM; DCGM PIPE_TENSOR_ACTIVE): how much of the time matrix math ran.",
    ),
    (
        "DRAM active",
        "xpu_gpu_dram_active_ratio",
        "xpu_mig_dram_active_ratio",
        "Share of cycles device memory was sending or receiving data (GPM; DCGM DRAM_ACTIVE). Near 1: memory bound.",
    ),
    (
        "SM occupancy",
        "xpu_gpu_sm_occupancy_ratio",
        "xpu_mig_sm_occupancy_ratio",
        "Resident warps over the SMs' maximum (GPM; DCGM SM_OCCUPANCY): how well kernels hide latency.",
    ),
)


def _with(selector: str, series: str) -> str:
    """``series`` (a name, maybe with a matcher) restricted by ``selector``."""
    if series.endswith("}"):
        return f"{series[:-1]}, {selector}}}"
    return f"{series}{{{selector}}}"


def profiling_panels(selector: str, legend: str, mig_legend: str) -> list[Panel]:
    """Per card (and per MIG instance) profiling ratios over the last sampling interval."""
    return [
        Panel(
            "timeseries",
            title,
            [t(_with(selector, card), legend), t(_with(selector, mig), mig_legend)],
            unit="percentunit",
            min=0,
            max=1,
            description=about + " Cards without GPM (before Hopper) have no series.",
        )
        for title, card, mig, about in PROFILING
    ]


def fleet_profiling_panels() -> list[Panel]:
    """Per node: the mean over its cards (MIG cards count with their card-level value)."""
    return [
        Panel(
            "timeseries",
            f"{title} by node",
            [t(f"avg by (instance) ({_with(N, card)})", "{{instance}}")],
            unit="percentunit",
            min=0,
            max=1,
            description=about,
        )
        for title, card, _mig, about in PROFILING
    ]


def node() -> dict[str, Any]:
    lg = "GPU {{gpu}}"
    panels = [
        row("Identity and state"),
        Panel("table", "GPUs", [table(f"xpu_gpu_info{{{NG}}}")], w=24, h=7),
        Panel(
            "state-timeline",
            "Sampling state",
            [t(f"xpu_gpu_up{{{NG}}}", lg)],
            thresholds=steps((None, RED), (1, GREEN)),
            mappings=UP_MAP,
            w=12,
            h=7,
        ),
        Panel(
            "table",
            "Sampling failures",
            [table(f"xpu_gpu_sample_failure{{{NG}}}")],
            w=12,
            h=7,
            description="Cards whose last cycle failed, with why (timeout, gpu_lost, reset_required).",
        ),
        faults_per_card(NG),
        row("Load"),
        Panel(
            "timeseries",
            "GPU utilization",
            [t(f"xpu_gpu_utilization_ratio{{{NG}}}", lg)],
            unit="percentunit",
            min=0,
            max=1,
        ),
        Panel(
            "timeseries",
            "Memory bandwidth utilization",
            [t(f"xpu_gpu_memory_utilization_ratio{{{NG}}}", lg)],
            unit="percentunit",
            min=0,
            max=1,
        ),
        Panel("timeseries", "Memory used", [t(f"xpu_gpu_memory_used_bytes{{{NG}}}", lg)], unit="bytes", min=0),
        Panel(
            "timeseries",
            "Memory used share",
            [t(f"xpu_gpu_memory_used_bytes{{{NG}}} / xpu_gpu_memory_total_bytes{{{NG}}}", lg)],
            unit="percentunit",
            min=0,
            max=1,
            thresholds=SHARE,
        ),
        Panel("timeseries", "Compute processes", [t(f"xpu_gpu_processes{{{NG}}}", lg)], min=0),
        Panel("timeseries", "SM clock", [t(f"xpu_gpu_sm_clock_hertz{{{NG}}}", lg)], unit="hertz"),
        row("Profiling (GPM)"),
        *profiling_panels(NG, lg, "GPU {{gpu}} MIG {{gpu_instance_id}}"),
        row("Thermals and power"),
        Panel(
            "timeseries",
            "GPU temperature",
            [t(f"xpu_gpu_temperature_celsius{{{NG}}}", lg)],
            unit="celsius",
            thresholds=TEMP,
        ),
        Panel(
            "timeseries",
            "HBM temperature",
            [t(f"xpu_gpu_memory_temperature_celsius{{{NG}}}", lg)],
            unit="celsius",
            thresholds=HBM_TEMP,
        ),
        Panel("timeseries", "Power draw", [t(f"xpu_gpu_power_watts{{{NG}}}", lg)], unit="watt", min=0),
        Panel(
            "timeseries",
            "Power against limit",
            [t(f"xpu_gpu_power_watts{{{NG}}} / xpu_gpu_power_limit_watts{{{NG}}}", lg)],
            unit="percentunit",
            min=0,
            max=1.1,
            thresholds=SHARE,
        ),
        Panel(
            "timeseries",
            "Energy use (from the energy counter)",
            [t(f"rate(xpu_gpu_energy_joules_total{{{NG}}}[{RI}])", lg)],
            unit="watt",
            min=0,
        ),
        Panel(
            "state-timeline",
            "Clocks-event reasons active",
            [
                t(
                    f'xpu_gpu_clock_event_active{{{NG}, reason!~"gpu_idle|applications_clocks_setting|display_clock_setting"}}',
                    "GPU {{gpu}} {{reason}}",
                )
            ],
            thresholds=steps((None, GREEN), (1, ORANGE)),
            w=12,
            h=10,
        ),
        row("Interconnect"),
        Panel(
            "timeseries",
            "PCIe transmit",
            [t(f"xpu_gpu_pcie_transmit_bytes_per_second{{{NG}}}", lg)],
            unit="Bps",
            min=0,
            description="GPM's average over the sampling interval; on cards without GPM the driver's 20 ms window.",
        ),
        Panel(
            "timeseries",
            "PCIe receive",
            [t(f"xpu_gpu_pcie_receive_bytes_per_second{{{NG}}}", lg)],
            unit="Bps",
            min=0,
            description="GPM's average over the sampling interval; on cards without GPM the driver's 20 ms window.",
        ),
        Panel(
            "timeseries",
            "PCIe replays",
            [t(f"increase(xpu_gpu_pcie_replays_total{{{NG}}}[{RI}])", lg)],
            thresholds=WARN_AT_1,
            min=0,
        ),
        Panel(
            "stat",
            "PCIe link",
            [
                instant(f"xpu_gpu_pcie_link_generation{{{NG}}}", "GPU {{gpu}} gen"),
                instant(f"xpu_gpu_pcie_link_width{{{NG}}}", "GPU {{gpu}} width"),
            ],
        ),
        Panel(
            "timeseries",
            "NVLink transmit",
            [t(f"sum by (gpu) (rate(xpu_gpu_nvlink_transmit_bytes_total{{{NG}}}[{RI}]))", lg)],
            unit="Bps",
            min=0,
        ),
        Panel(
            "timeseries",
            "NVLink receive",
            [t(f"sum by (gpu) (rate(xpu_gpu_nvlink_receive_bytes_total{{{NG}}}[{RI}]))", lg)],
            unit="Bps",
            min=0,
        ),
        Panel(
            "stat", "NVLinks down", [instant(f"sum by (gpu) (1 - xpu_gpu_nvlink_up{{{NG}}})", lg)], thresholds=BAD_AT_1
        ),
        Panel(
            "timeseries",
            "NVLink errors",
            [
                t(f"sum by (gpu) (rate(xpu_gpu_nvlink_crc_errors_total{{{NG}}}[{RI}]))", "GPU {{gpu}} CRC"),
                t(f"sum by (gpu) (rate(xpu_gpu_nvlink_replay_errors_total{{{NG}}}[{RI}]))", "GPU {{gpu}} replay"),
                t(f"sum by (gpu) (rate(xpu_gpu_nvlink_recovery_errors_total{{{NG}}}[{RI}]))", "GPU {{gpu}} recovery"),
            ],
            unit="cps",
            min=0,
        ),
        row("Memory errors and recovery"),
        Panel(
            "stat",
            "Uncorrectable ECC (volatile)",
            [instant(f'xpu_gpu_ecc_volatile_errors_total{{{NG}, kind="uncorrected"}}', lg)],
            thresholds=BAD_AT_1,
            w=6,
        ),
        Panel(
            "stat", "Row remap pending", [instant(f"xpu_gpu_row_remap_pending{{{NG}}}", lg)], thresholds=WARN_AT_1, w=6
        ),
        Panel(
            "stat", "Row remap failure", [instant(f"xpu_gpu_row_remap_failure{{{NG}}}", lg)], thresholds=BAD_AT_1, w=6
        ),
        Panel(
            "stat",
            "Driver recovery action",
            [instant(f"xpu_gpu_recovery_action{{{NG}}}", lg)],
            thresholds=BAD_AT_1,
            mappings=RECOVERY,
            w=6,
        ),
        Panel(
            "timeseries",
            "Corrected ECC errors",
            [t(f'increase(xpu_gpu_ecc_volatile_errors_total{{{NG}, kind="corrected"}}[{RI}])', lg)],
            min=0,
        ),
        Panel(
            "timeseries", "Remapped rows", [t(f"xpu_gpu_remapped_rows_total{{{NG}}}", "GPU {{gpu}} {{kind}}")], min=0
        ),
        row("MIG"),
        Panel("table", "MIG devices", [table(f"xpu_mig_instance_info{{{NG}}}")], w=12),
        Panel(
            "timeseries",
            "MIG memory used",
            [t(f"xpu_mig_memory_used_bytes{{{NG}}}", "GPU {{gpu}} GI {{gpu_instance_id}}")],
            unit="bytes",
            min=0,
        ),
        row("Exporter"),
        Panel(
            "timeseries",
            "Data age",
            [
                t('xpu_sample_age_seconds{instance=~"$node"}', "age"),
                t('xpu_sampler_interval_seconds{instance=~"$node"}', "interval"),
            ],
            unit="s",
            thresholds=steps((None, GREEN), (15, ORANGE), (30, RED)),
            w=8,
        ),
        Panel(
            "timeseries",
            "Driver calls",
            [t(f'sum by (call) (rate(xpu_backend_calls_total{{instance=~"$node"}}[{RI}]))', "{{call}}")],
            unit="reqps",
            w=8,
        ),
        Panel(
            "timeseries",
            "Driver call timeouts",
            [t(f"sum by (call) {counted(f'xpu_backend_call_timeouts_total{{{N}}}')}", "{{call}}")],
            thresholds=WARN_AT_1,
            w=8,
        ),
    ]
    return dashboard(
        "xpu-node", "XPU / Node GPUs", "One node's GPUs in detail.", [NODE_ONE, GPU_VAR], panels, ("node",)
    )


def with_gpu(expr: str) -> str:
    """Process and pod series name their card by uuid only: take its index from xpu_gpu_info."""
    return f"{expr} * on (instance, uuid) group_left (gpu) xpu_gpu_info"


def workloads() -> dict[str, Any]:
    ns = var_query(
        "namespace", "Namespace", 'label_values(xpu_pod_gpu_memory_used_bytes{instance=~"$node"}, namespace)'
    )
    pod = var_query(
        "pod", "Pod", 'label_values(xpu_pod_gpu_memory_used_bytes{instance=~"$node", namespace=~"$namespace"}, pod)'
    )
    sel = 'instance=~"$node", namespace=~"$namespace", pod=~"$pod"'
    panels = [
        row("Pods"),
        Panel(
            "table",
            "GPUs allocated to pods",
            [table(with_gpu(f"xpu_pod_gpu_allocated{{{sel}}}"))],
            w=24,
            h=7,
            description="Devices kubelet allocated (pod-resources API).",
        ),
        Panel(
            "timeseries",
            "GPU memory by pod",
            [t(f"sum by (namespace, pod) (xpu_pod_gpu_memory_used_bytes{{{sel}}})", "{{namespace}}/{{pod}}")],
            unit="bytes",
            min=0,
            stack=True,
        ),
        Panel(
            "timeseries",
            "SM share by pod",
            [
                t(
                    f"sum by (namespace, pod, gpu) ({with_gpu(f'xpu_pod_sm_utilization_ratio{{{sel}}}')})",
                    "{{namespace}}/{{pod}} GPU {{gpu}}",
                )
            ],
            unit="percentunit",
            min=0,
        ),
        Panel(
            "timeseries",
            "Processes by pod",
            [t(f"sum by (namespace, pod) (xpu_pod_gpu_processes{{{sel}}})", "{{namespace}}/{{pod}}")],
            min=0,
        ),
        Panel(
            "timeseries",
            "Compute processes per GPU",
            [t(f"xpu_gpu_processes{{{N}}}", "{{instance}} GPU {{gpu}}")],
            min=0,
        ),
        row("Processes"),
        Panel(
            "table",
            "Processes on GPUs",
            [table(with_gpu(f"xpu_process_gpu_memory_used_bytes{{{sel}}}"))],
            unit="bytes",
            w=24,
        ),
        Panel(
            "timeseries",
            "GPU memory by process",
            [t(with_gpu(f"xpu_process_gpu_memory_used_bytes{{{sel}}}"), "{{process}} ({{pid}}) GPU {{gpu}}")],
            unit="bytes",
            min=0,
        ),
        Panel(
            "timeseries",
            "SM share by process",
            [t(with_gpu(f"xpu_process_sm_utilization_ratio{{{sel}}}"), "{{process}} ({{pid}}) GPU {{gpu}}")],
            unit="percentunit",
            min=0,
        ),
        Panel(
            "stat",
            'Processes folded into "other"',
            [instant(f"sum(xpu_process_folded{{{N}}}) or vector(0)")],
            thresholds=WARN_AT_1,
            w=6,
            h=4,
        ),
    ]
    return dashboard(
        "xpu-workloads",
        "XPU / Pods and processes",
        "Who uses the GPUs: pods, containers, processes.",
        [NODE_VAR, ns, pod],
        panels,
        ("workloads",),
    )


def health() -> dict[str, Any]:
    panels = [
        row("Health checks and faults"),
        faults_per_card(N),
        Panel(
            "state-timeline",
            "Health checks not ok",
            [
                t(
                    f'max by (check, gpu, status) (xpu_health_check_status{{{N}, status!="ok"}}) == 1',
                    "{{check}} GPU {{gpu}} {{status}}",
                )
            ],
            thresholds=steps((None, ORANGE)),
            w=24,
            h=8,
        ),
        Panel(
            "timeseries",
            "Active faults by code",
            [t(f"sum by (gpu, code, action) (xpu_faults_active{{{N}}})", "GPU {{gpu}} {{code}} ({{action}})")],
            stack=True,
            thresholds=BAD_AT_1,
        ),
        Panel(
            "timeseries",
            "XID events",
            [t(f"sum by (gpu, xid) {counted(f'xpu_xid_errors_total{{{N}}}')}", "GPU {{gpu}} XID {{xid}}")],
            thresholds=WARN_AT_1,
            min=0,
        ),
        Panel("table", "Firing alerts", [table(FIRING_ALERTS)], w=24, h=7),
        row("Card conditions"),
        Panel(
            "timeseries",
            "Sampling failures",
            [t(f"sum by (gpu, code) (xpu_gpu_sample_failure{{{N}}})", "GPU {{gpu}} {{code}}")],
            thresholds=BAD_AT_1,
            min=0,
        ),
        Panel(
            "timeseries",
            "Uncorrectable ECC errors (volatile)",
            [t(f'xpu_gpu_ecc_volatile_errors_total{{{N}, kind="uncorrected"}}', "GPU {{gpu}}")],
            thresholds=BAD_AT_1,
            min=0,
        ),
        Panel(
            "timeseries",
            "Row remapping",
            [
                t(f"xpu_gpu_row_remap_pending{{{N}}}", "GPU {{gpu}} pending"),
                t(f"xpu_gpu_row_remap_failure{{{N}}}", "GPU {{gpu}} failure"),
            ],
            thresholds=BAD_AT_1,
            min=0,
        ),
        Panel(
            "timeseries",
            "NVLinks down",
            [t(f"sum by (gpu) (1 - xpu_gpu_nvlink_up{{{N}}})", "GPU {{gpu}}")],
            thresholds=BAD_AT_1,
            min=0,
        ),
        Panel(
            "timeseries",
            "Thermal and power slowdowns",
            [
                t(
                    f'xpu_gpu_clock_event_active{{{N}, reason=~"hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake_slowdown|hw_slowdown"}}',
                    "GPU {{gpu}} {{reason}}",
                )
            ],
            thresholds=WARN_AT_1,
            min=0,
        ),
        Panel(
            "timeseries",
            "Driver call timeouts",
            [t(f"sum by (call) {counted(f'xpu_backend_call_timeouts_total{{{N}}}')}", "{{call}}")],
            thresholds=WARN_AT_1,
            min=0,
        ),
        row("Replacement hook"),
        Panel(
            "timeseries", "Hook outbox", [t(f"xpu_hook_outbox_depth{{{N}}}", "{{target}}")], thresholds=WARN_AT_1, min=0
        ),
        Panel(
            "timeseries",
            "Hook delivery failures",
            [t(f"increase(xpu_hook_delivery_failures_total{{{N}}}[{RI}])", "{{target}}")],
            thresholds=BAD_AT_1,
            min=0,
        ),
    ]
    return dashboard(
        "xpu-health",
        "XPU / Health and faults",
        "Health checks, faults, XIDs and the hook over time.",
        [NODE_VAR],
        panels,
        ("health",),
    )


def partitions() -> dict[str, Any]:
    panels = [
        row("Partitions"),
        Panel("table", "Partitions", [table(f"xpu_partition_info{{{N}}}")], w=24, h=8),
        Panel(
            "timeseries",
            "Compute quota",
            [t(f"xpu_partition_compute_quota_ratio{{{N}}}", "GPU {{gpu}} {{partition_id}}")],
            unit="percentunit",
            min=0,
            max=1,
            stack=True,
        ),
        Panel(
            "timeseries",
            "Memory limit",
            [t(f"xpu_partition_memory_limit_bytes{{{N}}}", "GPU {{gpu}} {{partition_id}}")],
            unit="bytes",
            min=0,
            stack=True,
        ),
        Panel(
            "state-timeline",
            "Partition mode per GPU",
            [t(f"max by (gpu, mode) (xpu_gpu_partition_mode{{{N}}}) == 1", "GPU {{gpu}} {{mode}}")],
            thresholds=steps((None, BLUE)),
            w=24,
        ),
        row("MIG"),
        Panel(
            "stat",
            "MIG mode",
            [instant(f"xpu_gpu_mig_mode_enabled{{{N}}}", "GPU {{gpu}}")],
            mappings=[{"type": "value", "options": {"0": {"text": "off"}, "1": {"text": "on", "color": BLUE}}}],
        ),
        Panel(
            "stat",
            "MIG mode after reset differs",
            [
                instant(
                    f"xpu_gpu_mig_mode_pending_enabled{{{N}}} != bool xpu_gpu_mig_mode_enabled{{{N}}}", "GPU {{gpu}}"
                )
            ],
            thresholds=WARN_AT_1,
        ),
        Panel("table", "MIG devices", [table(f"xpu_mig_instance_info{{{N}}}")], w=24),
        Panel(
            "bargauge",
            "MIG memory used",
            [
                instant(
                    f"xpu_mig_memory_used_bytes{{{N}}} / xpu_mig_memory_total_bytes{{{N}}}",
                    "GPU {{gpu}} GI {{gpu_instance_id}}",
                )
            ],
            unit="percentunit",
            min=0,
            max=1,
            thresholds=SHARE,
        ),
        Panel(
            "bargauge", "MIG SMs", [instant(f"xpu_mig_multiprocessors{{{N}}}", "GPU {{gpu}} GI {{gpu_instance_id}}")]
        ),
    ]
    return dashboard(
        "xpu-partitions",
        "XPU / Partitions",
        "TDM partitions (compute and memory quotas) and MIG.",
        [NODE_VAR],
        panels,
        ("partitions",),
    )


DASHBOARDS = {
    "xpu-fleet.json": fleet,
    "xpu-node.json": node,
    "xpu-workloads.json": workloads,
    "xpu-health.json": health,
    "xpu-partitions.json": partitions,
}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


if __name__ == "__main__":
    for name, text in render().items():
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name}", file=sys.stderr)
