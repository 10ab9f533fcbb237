"""Which alert rule's runbook applies to a fault, for the status page's "what to do" links.

The runbooks are the alert rules' own (alerts/xpu-healthd.rules.yml), carried in runbooks_generated.py. An alert
over ``xpu_faults_active`` names the faults it fires on by code and action; the others alert on the metric a probe
also reads, and ``FAULT_ALERTS`` says which probe code that is (tests/healthd/daemon/test_runbooks.py checks both
against the rules).
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from healthd.daemon.runbooks_generated import ALERT_RUNBOOKS


@dataclass(frozen=True, slots=True)
class AlertRunbook:
    alert: str
    runbook: str
    fault_code: str = ""  # a regular expression over the fault's code; "": the alert does not read faults
    fault_action: str = ""  # the same over its action label


# probe code -> the alert on the same condition (its expression reads a metric, not xpu_faults_active)
FAULT_ALERTS: Mapping[str, str] = {
    "gpu_lost": "XpuGpuFallenOffBus",
    "gpu_reset_required": "XpuGpuResetRequired",
    "driver_call_timeout": "XpuGpuDriverCallHung",
    "driver_version_mismatch": "XpuDriverDown",
    "gpu_count_low": "XpuGpuMissing",
    "gpu_not_visible": "XpuGpuMissing",
    "ecc_uncorrectable_volatile": "XpuGpuVolatileUncorrectableEcc",
    "ecc_row_remap_pending": "XpuGpuRowRemapPending",
    "ecc_row_remap_failure": "XpuGpuRowRemapFailure",
    "memory_unowned": "XpuGpuMemoryLeak",
    "nvlink_down": "XpuGpuNvlinkDown",
    "nvlink_crc_rate": "XpuGpuNvlinkCrcErrorRateHigh",
    "nvlink_replay_errors": "XpuGpuNvlinkReplayErrors",
    "nvlink_recovery_errors": "XpuGpuNvlinkRecoveryErrors",
}


def alert_runbooks() -> tuple[AlertRunbook, ...]:
    """Every alert rule's runbook, as the rules file had them when runbooks_generated.py was written."""
    return tuple(AlertRunbook(*row) for row in ALERT_RUNBOOKS)


def runbook_for(code: str, action: str, alerts: Sequence[AlertRunbook]) -> AlertRunbook | None:
    """The first alert whose fault matchers take (code, action), else the alert FAULT_ALERTS names for the code."""
    for a in alerts:
        if a.fault_code and re.fullmatch(a.fault_code, code) and re.fullmatch(a.fault_action, action):
            return a
    name = FAULT_ALERTS.get(code)
    return next((a for a in alerts if a.alert == name), None)


def runbook_link(alert: AlertRunbook) -> str:
    return f'<a href="#runbook-{html.escape(alert.alert)}">{html.escape(alert.alert)}</a>'


def runbooks_section(alerts: Sequence[AlertRunbook]) -> str:
    """The runbooks the active faults link to, each with the anchor its links point at."""
    if not alerts:
        return ""
    items = "".join(
        f'<li id="runbook-{html.escape(a.alert)}"><b>{html.escape(a.alert)}</b>: {html.escape(a.runbook)}</li>'
        for a in alerts
    )
    return f'<h2>Runbooks (from the alert rules)</h2><ul class="runbooks">{items}</ul>'
