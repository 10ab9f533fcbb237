"""The cards component: the card, MIG and exporter collectors, and, when [exporter] asks, dcgm-exporter's series."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from exporter.attribution.attributor import Attribution
from exporter.collectors import Collector, default_collectors
from exporter.collectors.dcgm_fields import DEFAULT_VERSION as DCGM_DEFAULT
from exporter.collectors.dcgm_fields import VERSIONS as DCGM_VERSIONS
from exporter.settings import option
from healthd.component import ComponentBase
from healthd.faults.fault import Fault
from healthd.node import Node


@dataclass(frozen=True, slots=True)
class ExporterSettings:
    """[exporter]"""

    dcgm_compat: bool = False  # also export dcgm-exporter's default series (docs/dcgm-compat.md)
    # the host-name label of dcgm-compat series: "Hostname" for dcgm-exporter releases before 4.6.0-4.8.3
    dcgm_hostname_label: str = option("hostname", choices=("hostname", "Hostname"))
    dcgm_compat_version: str = option(DCGM_DEFAULT, choices=DCGM_VERSIONS)  # dcgm-exporter's names of that line


def last_xid_per_gpu(active_faults: Iterable[Fault]) -> Mapping[int, int]:
    """The XID of each card's most recent active XID fault, for dcgm-exporter's DCGM_FI_DEV_XID_ERRORS."""
    latest: dict[int, tuple[float, int]] = {}
    for fault in active_faults:
        xid = fault.evidence.get("xid", "")
        if fault.gpu is None or not fault.code.startswith("xid_") or not xid.isdigit():
            continue
        if fault.gpu.index not in latest or fault.last_seen >= latest[fault.gpu.index][0]:
            latest[fault.gpu.index] = (fault.last_seen, int(xid))
    return {gpu: xid for gpu, (_, xid) in latest.items()}


class CardMetrics(ComponentBase):
    name = "cards"

    def __init__(
        self,
        settings: ExporterSettings,
        last_xid: Callable[[], Mapping[int, int]] | None = None,
        attribution: Callable[[], Attribution | None] | None = None,
    ) -> None:
        self._collectors: list[Collector] = list(default_collectors())
        if settings.dcgm_compat:  # dcgm-exporter names; the host name as dcgm-exporter sets it in Kubernetes
            from exporter.collectors.dcgm_compat import DcgmCompatCollector  # imported only where it is turned on

            hostname = os.environ.get("NODE_NAME") or socket.gethostname()
            self._collectors.append(
                DcgmCompatCollector(
                    hostname,
                    last_xid,
                    hostname_label=settings.dcgm_hostname_label,
                    attribution=attribution,
                    version=settings.dcgm_compat_version,
                )
            )

    def collectors(self) -> Sequence[Collector]:
        return self._collectors


def build(node: Node) -> CardMetrics:
    return CardMetrics(
        node.settings(ExporterSettings), lambda: last_xid_per_gpu(node.active_faults()), node.attribution
    )
