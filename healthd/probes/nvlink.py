"""NVLink: links that were up and went down, replay/recovery error increments, CRC error rate.

Cards without NVLink (PCIe cards, a single SXM card in a VM: the H200 capture answers NotSupported on all 18
links) report the check as unsupported, never as a fault (DCGM_FR_NVLINK_DOWN on PCIe GPUs: NVIDIA/NVSentinel#1481).
Fabric (NVSwitch) state is not checked: the Backend has no nvmlDeviceGetGpuFabricInfo reading yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.backends.types import LinkState, NvLinkSample, Unsupported
from exporter.settings import option
from exporter.snapshot import GpuSnapshot, Snapshot
from healthd.findings import Action, Finding, GpuRef, ProbeReport, Severity
from healthd.host.view import ProbeHost
from healthd.probes.common import ReportBuilder, evidence

CHECK = "nvlink"


SECTION = "nvlink"


@dataclass(frozen=True, slots=True)
class Settings:
    """[health.nvlink]"""

    # DCGM MonitorNVLink: "CRC errors only matter at rates of 100+ per second" -> FAIL.
    crc_per_second_fail: float = option(100.0, above=0)
    # Increments are single moments; they stay reported for this long after the last one, then clear.
    error_hold_seconds: float = option(600.0, above=0)


@dataclass(slots=True)
class _LinkState:
    seen_up: bool = False
    crc: int | None = None
    replay: int | None = None
    recovery: int | None = None
    at: float = 0.0
    # (last increment time, increment size) per error kind
    replay_hit: tuple[float, int] | None = None
    recovery_hit: tuple[float, int] | None = None
    crc_hit: tuple[float, float] | None = None  # (time, rate per second)


def _no_nvlink(gpu: GpuSnapshot) -> str | None:
    """A card without NVLink is unsupported whether or not it answers now."""
    return "the card has no NVLink" if gpu.info is not None and gpu.info.nvlink_count == 0 else None


class NvLinkProbe:
    name = CHECK

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self._links: dict[tuple[str, int], _LinkState] = {}

    def evaluate(self, snapshot: Snapshot, now: float) -> ProbeReport:
        report = ReportBuilder(CHECK)
        for g, ref, sample in report.fresh_cards(snapshot, _no_nvlink):
            links = sample.nvlinks
            if isinstance(links, Unsupported) or not links:
                report.unsupported(ref, "NVLink is not supported on this card")
                continue
            findings: list[Finding] = []
            never_up = up = 0
            key = g.uuid or str(g.index)
            for link in links:
                state = self._links.get((key, link.link))
                if state is None:
                    state = self._links[(key, link.link)] = _LinkState()
                elif (
                    link.state is LinkState.UP
                    and state.seen_up
                    and link.replay_errors == state.replay
                    and link.recovery_errors == state.recovery
                    and link.crc_errors == state.crc
                    and state.replay_hit is None
                    and state.recovery_hit is None
                    and state.crc_hit is None
                ):
                    # the usual case: up as before, no counter moved, no increment ever: _link would only stamp it
                    state.at = now
                    up += 1
                    continue
                found = self._link(ref, link, state, now)
                if found:
                    findings += found
                if not state.seen_up:
                    never_up += 1
                if link.state is LinkState.UP:
                    up += 1
            if never_up == len(links):
                # GPUd's rule: an NVLink-capable card with no active link at all. A warning, not an action: links can
                # be down from boot on purpose (and DCGM reports links down in some MIG setups).
                findings.append(
                    Finding(
                        CHECK,
                        "nvlink_none_active",
                        Severity.WARNING,
                        Action.NONE,
                        f"none of the {len(links)} NVLinks has been up since the daemon started",
                        ref,
                        evidence(links=len(links)),
                    )
                )
            report.gpu_done(ref, findings, f"{up}/{len(links)} links up")
        return report.build()

    def _link(self, ref: GpuRef, link: NvLinkSample, st: _LinkState, now: float) -> list[Finding]:
        t = self.settings
        out: list[Finding] = []
        if link.state is LinkState.UP:
            st.seen_up = True
        elif st.seen_up:
            # DCGM MonitorNVLinkStatus: link Down -> FAIL; NVSentinel maps DCGM_FR_NVLINK_DOWN to RESTART_VM and GPUd
            # to REBOOT_SYSTEM: a link that trained once and dropped comes back with a reset or reboot.
            out.append(
                Finding(
                    CHECK,
                    "nvlink_down",
                    Severity.CRITICAL,
                    Action.REBOOT_NODE,
                    f"NVLink {link.link} was up and is down",
                    ref,
                    evidence(link=link.link),
                )
            )
        dt = now - st.at if st.at else 0.0
        if isinstance(link.replay_errors, int):
            if st.replay is not None and link.replay_errors > st.replay:
                st.replay_hit = (now, link.replay_errors - st.replay)
            st.replay = link.replay_errors
        if isinstance(link.recovery_errors, int):
            if st.recovery is not None and link.recovery_errors > st.recovery:
                st.recovery_hit = (now, link.recovery_errors - st.recovery)
            st.recovery = link.recovery_errors
        if isinstance(link.crc_errors, int):
            if st.crc is not None and link.crc_errors > st.crc and dt > 0:
                rate = (link.crc_errors - st.crc) / dt
                if rate >= t.crc_per_second_fail:
                    st.crc_hit = (now, rate)
            st.crc = link.crc_errors
        st.at = now
        # DCGM: replay or recovery delta >= 1 -> FAIL. Replays are retried by the link layer and cost bandwidth only,
        # so they are a warning here; a recovery (the link retrained) is critical and a reset clears it.
        if st.replay_hit and now - st.replay_hit[0] < t.error_hold_seconds:
            out.append(
                Finding(
                    CHECK,
                    "nvlink_replay_errors",
                    Severity.WARNING,
                    Action.NONE,
                    f"NVLink {link.link}: {st.replay_hit[1]} new replay error(s)",
                    ref,
                    evidence(link=link.link, increment=st.replay_hit[1], total=st.replay),
                )
            )
        if st.recovery_hit and now - st.recovery_hit[0] < t.error_hold_seconds:
            out.append(
                Finding(
                    CHECK,
                    "nvlink_recovery_errors",
                    Severity.CRITICAL,
                    Action.RESET_GPU,
                    f"NVLink {link.link}: {st.recovery_hit[1]} new recovery error(s)",
                    ref,
                    evidence(link=link.link, increment=st.recovery_hit[1], total=st.recovery),
                )
            )
        if st.crc_hit and now - st.crc_hit[0] < t.error_hold_seconds:
            out.append(
                Finding(
                    CHECK,
                    "nvlink_crc_rate",
                    Severity.CRITICAL,
                    Action.RESET_GPU,
                    f"NVLink {link.link}: CRC errors at {st.crc_hit[1]:.0f}/s (threshold {t.crc_per_second_fail:g}/s)",
                    ref,
                    evidence(link=link.link, rate_per_second=round(st.crc_hit[1], 1), total=st.crc),
                )
            )
        return out


def build(settings: Settings, host: ProbeHost) -> NvLinkProbe:
    return NvLinkProbe(settings)
