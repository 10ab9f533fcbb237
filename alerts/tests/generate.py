"""Write alerts/tests/xpu-healthd.test.yml, the promtool unit tests of alerts/xpu-healthd.rules.yml.

The cases below are the hand-written expectations: input series, when each alert must still be quiet (pending or
flapping), when it must fire and with which labels. Only the annotation text is filled in here, by rendering the
rule's own templates with the expected labels and value (promtool compares annotations verbatim). Run it after
changing a rule or a case: ``python3 alerts/tests/generate.py``; tests/dashboards/test_alert_rules.py fails if the
committed file is out of date.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE.parent / "xpu-healthd.rules.yml"
OUTPUT = HERE / "xpu-healthd.test.yml"

N = 'instance="node1:9410",job="xpu-healthd"'
U = "GPU-5a1c0e3e-8f2b-4c61-9d0a-1b7e2c3d4f53"
G3 = f'{N},gpu="3",uuid="{U}"'
NODE = {"instance": "node1:9410"}
GPU3 = {**NODE, "gpu": "3", "uuid": U}
RESET_CRITICAL = 'action="reset_gpu",severity="critical"'
FID = {"fault_id": "flt-3", "node": "node1"}  # what the daemon's fault metrics carry besides the card
F3 = f'{G3},fault_id="flt-3",node="node1"'
REBOOT_CRITICAL = 'action="reboot_node",severity="critical"'


@dataclass
class Fire:
    at: str
    labels: dict[str, str]  # series labels the alert keeps, without severity/action
    severity: str
    action: str
    value: float = 1


@dataclass
class Case:
    alert: str
    about: str
    series: dict[str, str]
    quiet: list[str]  # eval times at which the alert must not fire
    fire: list[Fire] = field(default_factory=list)
    quiet_alerts: list[str] = field(default_factory=list)  # other alerts that must stay quiet at every eval time


CASES = [
    Case(
        "XpuGpuFallenOffBus",
        "a lost card fires after 1m, with the daemon's fault id and node name",
        {
            f'xpu_gpu_sample_failure{{{G3},code="gpu_lost"}}': "1x10",
            f'xpu_faults_active{{{F3},code="gpu_lost",action="replace_node",severity="fatal"}}': "1x10",
        },
        quiet=["0m"],
        fire=[Fire("2m", {**GPU3, **FID}, "fatal", "replace_node")],
        quiet_alerts=["XpuGpuResetRequired", "XpuGpuDriverCallHung"],
    ),
    Case(
        "XpuGpuFallenOffBus",
        "a card that comes and goes every minute never fires",
        {
            f'xpu_gpu_sample_failure{{{G3},code="gpu_lost"}}': "1 stale 1 stale 1 stale 1 stale",
            f'xpu_faults_active{{{F3},code="gpu_lost",action="replace_node",severity="fatal"}}': "1x10",
        },
        quiet=["0m", "1m", "2m", "3m", "4m", "5m", "6m"],
    ),
    Case(
        "XpuGpuMissing",
        "the card count drops from 8 to 7",
        {f"xpu_gpus{{{N}}}": "8x10 7x10"},
        quiet=["10m", "14m"],
        fire=[Fire("17m", {**NODE, "job": "xpu-healthd"}, "critical", "reboot_node", 7)],
    ),
    Case(
        "XpuGpuResetRequired",
        "reset required fires after 2m",
        {f'xpu_gpu_sample_failure{{{G3},code="reset_required"}}': "1x10"},
        quiet=["1m"],
        fire=[Fire("3m", GPU3, "critical", "reset_gpu")],
        quiet_alerts=["XpuGpuFallenOffBus"],
    ),
    Case(
        "XpuGpuDriverCallHung",
        "a hang of 5m fires",
        {f'xpu_gpu_sample_failure{{{G3},code="timeout"}}': "1x10"},
        quiet=["4m"],
        fire=[Fire("6m", GPU3, "critical", "reboot_node")],
    ),
    Case(
        "XpuGpuDriverCallHung",
        "a hang that clears every 4 minutes never fires",
        {f'xpu_gpu_sample_failure{{{G3},code="timeout"}}': "1 1 1 1 stale 1 1 1 1 stale 1 1 1 1"},
        quiet=["4m", "8m", "9m", "13m"],
    ),
    Case(
        "XpuDriverDown",
        "NVML down for 5m",
        {f"xpu_backend_up{{{N}}}": "1 1 0x10"},
        quiet=["1m", "6m"],
        fire=[Fire("8m", {**NODE, "job": "xpu-healthd"}, "fatal", "reboot_node", 0)],
    ),
    Case(
        "XpuGpuDriverRequestsRecovery",
        "the driver probe decoded a drain-and-reset request on GPU 3: the fault's action and severity",
        {
            f'xpu_faults_active{{{F3},code="recovery_action_drain_and_reset",{RESET_CRITICAL}}}': "0 0 1x5",
            f"xpu_gpu_recovery_action{{{G3}}}": "0 0 4x5",
        },
        quiet=["1m", "2m"],
        fire=[Fire("4m", {**GPU3, **FID, "code": "recovery_action_drain_and_reset"}, "critical", "reset_gpu")],
        quiet_alerts=["XpuGpuDriverRecoveryAdvice"],
    ),
    Case(
        "XpuGpuDriverRequestsRecovery",
        "a reboot request",
        {f'xpu_faults_active{{{F3},code="recovery_action_node_reboot",{REBOOT_CRITICAL}}}': "0 1x5"},
        quiet=["1m"],
        fire=[Fire("3m", {**GPU3, **FID, "code": "recovery_action_node_reboot"}, "critical", "reboot_node")],
    ),
    Case(
        "XpuGpuDriverRecoveryAdvice",
        "a drain-peer-to-peer request asks for no reset",
        {f'xpu_faults_active{{{G3},code="recovery_action_drain_p2p",action="none",severity="warning"}}': "0 1x5"},
        quiet=["1m"],
        fire=[Fire("3m", {**GPU3, "code": "recovery_action_drain_p2p"}, "warning", "none")],
        quiet_alerts=["XpuGpuDriverRequestsRecovery"],
    ),
    Case(
        "XpuGpuVolatileUncorrectableEcc",
        "two uncorrectable errors",
        {
            f'xpu_gpu_ecc_volatile_errors_total{{{G3},kind="uncorrected"}}': "0 0 2x5",
            f'xpu_gpu_ecc_volatile_errors_total{{{G3},kind="corrected"}}': "0+50x7",
        },
        quiet=["1m", "2m"],
        fire=[Fire("4m", GPU3, "critical", "reset_gpu", 2)],
    ),
    Case(
        "XpuGpuRowRemapPending",
        "remap pending for 5m",
        {f"xpu_gpu_row_remap_pending{{{G3}}}": "0 1x10"},
        quiet=["5m"],
        fire=[Fire("7m", GPU3, "warning", "reset_gpu")],
        quiet_alerts=["XpuGpuRowRemapFailure"],
    ),
    Case(
        "XpuGpuRowRemapFailure",
        "remap failure",
        {
            f"xpu_gpu_row_remap_failure{{{G3}}}": "0 1x5",
            f'xpu_faults_active{{{F3},code="ecc_row_remap_failure",action="replace_node",severity="fatal"}}': "0 1x5",
        },
        quiet=["1m"],
        fire=[Fire("3m", {**GPU3, **FID}, "fatal", "replace_node")],
    ),
    Case(
        "XpuGpuMemoryLeak",
        "2 GiB held with no process for 10m",
        {f"xpu_gpu_processes{{{G3}}}": "0x20", f"xpu_gpu_memory_used_bytes{{{G3}}}": "2147483648x20"},
        quiet=["9m"],
        fire=[Fire("11m", GPU3, "warning", "reset_gpu", 2147483648)],
    ),
    Case(
        "XpuGpuMemoryLeak",
        "memory with a process on the card, or little memory without one, is no leak",
        {
            f"xpu_gpu_processes{{{G3}}}": "1x20",
            f"xpu_gpu_memory_used_bytes{{{G3}}}": "100000000000x20",
            f'xpu_gpu_processes{{{N},gpu="4",uuid="GPU-4"}}': "0x20",
            f'xpu_gpu_memory_used_bytes{{{N},gpu="4",uuid="GPU-4"}}': "536870912x20",
        },
        quiet=["15m"],
    ),
    Case(
        "XpuGpuNvlinkDown",
        "link 4 down for 2m",
        {f'xpu_gpu_nvlink_up{{{G3},link="4"}}': "1 0x10", f'xpu_gpu_nvlink_up{{{G3},link="5"}}': "1x10"},
        quiet=["2m"],
        fire=[Fire("4m", {**GPU3, "link": "4"}, "critical", "reboot_node", 0)],
    ),
    Case(
        "XpuGpuNvlinkCrcErrorRateHigh",
        "200 CRC errors/s on link 2, 10/s on link 3",
        {
            f'xpu_gpu_nvlink_crc_errors_total{{{G3},link="2"}}': "0+12000x20",
            f'xpu_gpu_nvlink_crc_errors_total{{{G3},link="3"}}': "0+600x20",
        },
        quiet=["5m"],
        fire=[Fire("9m", {**GPU3, "link": "2"}, "critical", "reset_gpu", 200)],
    ),
    Case(
        "XpuGpuNvlinkReplayErrors",
        "replays keep coming on link 1",
        {
            f'xpu_gpu_nvlink_replay_errors_total{{{G3},link="1"}}': "0+6x20",
            f'xpu_gpu_nvlink_recovery_errors_total{{{G3},link="1"}}': "0x20",
            f'xpu_gpu_nvlink_replay_errors_total{{{G3},link="2"}}': "0x20",
            f'xpu_gpu_nvlink_recovery_errors_total{{{G3},link="2"}}': "0x20",
        },
        quiet=["5m"],
        fire=[Fire("12m", {**GPU3, "link": "1"}, "warning", "none", 60)],
        quiet_alerts=["XpuGpuNvlinkRecoveryErrors"],
    ),
    Case(
        "XpuGpuNvlinkRecoveryErrors",
        "link 2 retrained twice",
        {
            f'xpu_gpu_nvlink_recovery_errors_total{{{G3},link="2"}}': "0 0 0 2x10",
            f'xpu_gpu_nvlink_recovery_errors_total{{{G3},link="1"}}': "0x13",
        },
        quiet=["2m", "3m"],
        fire=[Fire("5m", {**GPU3, "link": "2"}, "critical", "reset_gpu", 2)],
        quiet_alerts=["XpuGpuNvlinkReplayErrors"],
    ),
    Case(
        "XpuGpuPcieReplayRateHigh",
        "20 replays a minute",
        {f"xpu_gpu_pcie_replays_total{{{G3}}}": "0+20x30"},
        quiet=["10m", "14m"],
        fire=[Fire("16m", GPU3, "warning", "none", 20)],
    ),
    Case(
        "XpuGpuComputeProhibited",
        "compute mode prohibited",
        {
            f'xpu_gpu_compute_mode{{{G3},mode="prohibited"}}': "1x10",
            f'xpu_gpu_compute_mode{{{G3},mode="default"}}': "0x10",
        },
        quiet=["4m"],
        fire=[Fire("6m", GPU3, "critical", "none")],
    ),
    Case(
        "XpuGpuComputeModeMixed",
        "one card in exclusive-process, the other in default",
        {
            f'xpu_gpu_compute_mode{{{N},gpu="0",uuid="GPU-0",mode="default"}}': "1x20",
            f'xpu_gpu_compute_mode{{{N},gpu="0",uuid="GPU-0",mode="exclusive_process"}}': "0x20",
            f'xpu_gpu_compute_mode{{{N},gpu="1",uuid="GPU-1",mode="default"}}': "0x20",
            f'xpu_gpu_compute_mode{{{N},gpu="1",uuid="GPU-1",mode="exclusive_process"}}': "1x20",
        },
        quiet=["14m"],
        fire=[Fire("16m", NODE, "warning", "none", 2)],
        quiet_alerts=["XpuGpuComputeProhibited"],
    ),
    Case(
        "XpuGpuComputeModeMixed",
        "all cards in exclusive-process is no anomaly",
        {
            f'xpu_gpu_compute_mode{{{N},gpu="0",uuid="GPU-0",mode="exclusive_process"}}': "1x20",
            f'xpu_gpu_compute_mode{{{N},gpu="1",uuid="GPU-1",mode="exclusive_process"}}': "1x20",
        },
        quiet=["16m"],
    ),
    Case(
        "XpuGpuThermalSlowdown",
        "hardware thermal slowdown for 10m",
        {
            f'xpu_gpu_clock_event_active{{{G3},reason="hw_thermal_slowdown"}}': "1x15",
            f'xpu_gpu_clock_event_active{{{G3},reason="sw_power_cap"}}': "1x15",
        },
        quiet=["9m"],
        fire=[Fire("11m", GPU3, "warning", "none")],
        quiet_alerts=["XpuGpuPowerSlowdown"],
    ),
    Case(
        "XpuGpuPowerSlowdown",
        "power brake for 10m",
        {f'xpu_gpu_clock_event_active{{{G3},reason="hw_power_brake_slowdown"}}': "1x15"},
        quiet=["9m"],
        fire=[Fire("11m", GPU3, "warning", "none")],
        quiet_alerts=["XpuGpuThermalSlowdown"],
    ),
    Case(
        "XpuFatalXid",
        "XID 79 fault with the catalog action replace_node",
        {
            f'xpu_faults_active{{{F3},code="xid_79",action="replace_node",severity="fatal"}}': "0 1x5",
            f'xpu_faults_active{{{N},gpu="4",uuid="GPU-4",code="xid_13",action="restart_app",severity="warning"}}': (
                "0 1x5"
            ),
        },
        quiet=["1m"],
        fire=[Fire("2m", {**GPU3, **FID, "code": "xid_79"}, "fatal", "replace_node")],
    ),
    Case(
        "XpuFatalXid",
        "the same XID on two cards: one alert per card",
        {
            f'xpu_faults_active{{{G3},code="xid_48",action="reset_gpu",severity="critical"}}': "0 1x5",
            f'xpu_faults_active{{{N},gpu="5",uuid="GPU-5",code="xid_48",action="reset_gpu",severity="critical"}}': (
                "0 1x5"
            ),
        },
        quiet=["1m"],
        fire=[
            Fire("2m", {**GPU3, "code": "xid_48"}, "critical", "reset_gpu"),
            Fire("2m", {**NODE, "gpu": "5", "uuid": "GPU-5", "code": "xid_48"}, "critical", "reset_gpu"),
        ],
    ),
    Case(
        "XpuApplicationXid",
        "XID 13 is the application's: restart_app, never a GPU or node action",
        {f'xpu_faults_active{{{G3},code="xid_13",action="restart_app",severity="warning"}}': "0 1x5"},
        quiet=["1m"],
        fire=[Fire("2m", {**GPU3, "code": "xid_13"}, "warning", "restart_app")],
        quiet_alerts=["XpuFatalXid"],
    ),
    Case(
        "XpuHealthCheckFailed",
        "the ecc check fails for 5m",
        {
            f'xpu_health_check_status{{{G3},check="ecc",status="failed"}}': "1x10",
            f'xpu_health_check_status{{{G3},check="ecc",status="ok"}}': "0x10",
            f'xpu_health_check_status{{{G3},check="nvlink",status="ok"}}': "1x10",
        },
        quiet=["4m"],
        fire=[Fire("6m", {**GPU3, "check": "ecc"}, "critical", "none")],
    ),
    Case(
        "XpuExporterDown",
        "scrapes fail for 3m",
        {f"up{{{N}}}": "1 0x5"},
        quiet=["3m"],
        fire=[Fire("5m", {**NODE, "job": "xpu-healthd"}, "critical", "none", 0)],
    ),
    Case(
        "XpuExporterDataStale",
        "the last cycle is 20s old with a 5s interval",
        {f"xpu_sample_age_seconds{{{N}}}": "1 1 20x5", f"xpu_sampler_interval_seconds{{{N}}}": "5x8"},
        quiet=["1m", "3m"],
        fire=[Fire("5m", {**NODE, "job": "xpu-healthd"}, "critical", "none", 20)],
    ),
    Case(
        "XpuExporterCollectorFailing",
        "the card collector fails for 5m",
        {
            f'xpu_collector_success{{{N},collector="card"}}': "1 0x8",
            f'xpu_collector_success{{{N},collector="mig"}}': "1x9",
        },
        quiet=["5m"],
        fire=[Fire("7m", {**NODE, "job": "xpu-healthd", "collector": "card"}, "warning", "none", 0)],
    ),
    Case(
        "XpuHookDeliveryFailing",
        "3 faults wait and deliveries fail",
        {
            f'xpu_hook_outbox_depth{{{N},target="standby"}}': "0 3x15",
            f'xpu_hook_delivery_failures_total{{{N},target="standby"}}': "0 0+2x15",
        },
        quiet=["5m"],
        fire=[Fire("7m", {**NODE, "job": "xpu-healthd", "target": "standby"}, "critical", "none", 3)],
    ),
    Case(
        "XpuHookDeliveryFailing",
        "an outbox that drains (no failures) is not alerted",
        {
            f'xpu_hook_outbox_depth{{{N},target="standby"}}': "0 3x15",
            f'xpu_hook_delivery_failures_total{{{N},target="standby"}}': "0x16",
        },
        quiet=["7m", "12m"],
    ),
]

_TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}")


def go_value(value: float) -> str:
    """Go's %v of a float64 for the values used here (integers and short decimals)."""
    if float(value).is_integer() and abs(value) < 1e21:
        return str(int(value)) if abs(value) < 1e6 else f"{value:g}".replace("e+0", "e+0")
    return repr(float(value))


def render(text: str, labels: dict[str, str], value: float) -> str:
    def one(match: re.Match[str]) -> str:
        expr = match.group(1)
        if expr.startswith("$labels."):
            return labels.get(expr[len("$labels.") :], "")
        if expr == "$value":
            return go_value(value)
        printf = re.fullmatch(r"printf `%\.(\d)f` \$value", expr)
        if printf:
            return f"{value:.{int(printf.group(1))}f}"
        raise ValueError(f"template {expr!r} is not supported by generate.py")

    return _TEMPLATE.sub(one, text)


def rule_annotations() -> dict[str, dict[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r["annotations"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def build() -> dict[str, Any]:
    annotations = rule_annotations()
    tests = []
    for case in CASES:
        if case.alert not in annotations:
            raise SystemExit(f"case {case.about!r}: no rule {case.alert}")
        checks: list[dict[str, Any]] = [
            {"eval_time": at, "alertname": case.alert, "exp_alerts": []} for at in case.quiet
        ]
        times = [*case.quiet, *(f.at for f in case.fire)]
        checks += [
            {"eval_time": at, "alertname": other, "exp_alerts": []} for other in case.quiet_alerts for at in times
        ]
        expected: dict[str, list[dict[str, Any]]] = {}  # eval time -> every alert expected then
        for fire in case.fire:
            labels = {**fire.labels, "severity": fire.severity, "action": fire.action}
            rendered = {k: render(v, labels, fire.value) for k, v in annotations[case.alert].items()}
            expected.setdefault(fire.at, []).append({"exp_labels": labels, "exp_annotations": rendered})
        checks += [{"eval_time": at, "alertname": case.alert, "exp_alerts": alerts} for at, alerts in expected.items()]
        tests.append(
            {
                "name": f"{case.alert}: {case.about}",
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
                "alert_rule_test": checks,
            }
        )
    return {"rule_files": ["../xpu-healthd.rules.yml"], "evaluation_interval": "1m", "tests": tests}


def text() -> str:
    header = "# Generated by alerts/tests/generate.py from its hand-written cases; edit the cases there.\n"
    return header + yaml.safe_dump(build(), sort_keys=False, width=200, allow_unicode=True)


if __name__ == "__main__":
    OUTPUT.write_text(text())
    print(f"wrote {OUTPUT} ({len(CASES)} cases)", file=sys.stderr)
