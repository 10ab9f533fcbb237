"""Faults that come back after reboots: each fatal finding notes the boot it was seen in, and one seen in more than
``escalation_reboots`` boots within ``escalation_window_seconds`` is raised to replace_node (the node, not the job
or the card, is what keeps failing)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import structlog

from healthd.faults.fault import identity_of
from healthd.faults.journal import Journal
from healthd.faults.settings import FaultsSettings
from healthd.findings import Action, Finding, Severity

log = structlog.get_logger("faults")


def read_boot_id(path: Path) -> str:
    """The kernel's boot id; a daemon that cannot read it runs, but cannot tell reboots apart."""
    try:
        return path.read_text().strip() or "unknown"
    except OSError as exc:
        log.warning("cannot read boot id; reboot detection is off", path=str(path), error=str(exc))
        return "unknown"


class RebootEscalation:
    """Counts the boots each fatal identity was seen in (stored in the journal) and names the action it gets.

    A boot is noted in the same journal commit as the records of the finding that brought it (``unwritten`` gives
    the engine what to add to its next commit, ``written`` what that commit stored), so a fatal finding is one write.
    """

    def __init__(self, journal: Journal, settings: FaultsSettings, boot_id: str) -> None:
        self._journal = journal
        self._s = settings
        self.boot_id = boot_id
        self._boots: dict[tuple[str, str], int] = {}  # (identity, boot) -> boots seen, counting this one
        self._unwritten: set[str] = set()  # identities whose note of this boot is not in the journal yet

    def learn(self, findings: Iterable[Finding], now: float) -> None:
        """Count the boots of each new fatal identity. Journal reads: call it before taking the engine's state lock."""
        if self._s.escalation_reboots <= 0:
            return
        for finding in findings:
            if finding.severity >= Severity.FATAL:
                self._count(identity_of(finding.check, finding.code, finding.gpu), now)

    def action(self, identity: str, finding: Finding, now: float) -> Action:
        """The finding's own action, or replace_node once its identity came back after enough reboots."""
        if finding.severity < Severity.FATAL or self._s.escalation_reboots <= 0:
            return finding.action
        boots = self._boots.get((identity, self.boot_id))
        if boots is None:  # normally counted before the state lock was taken (learn)
            boots = self._count(identity, now)
        return Action.REPLACE_NODE if boots > self._s.escalation_reboots else finding.action

    def unwritten(self) -> list[tuple[str, str]]:
        """(identity, boot id) notes the next journal commit is to store."""
        return [(identity, self.boot_id) for identity in sorted(self._unwritten)]

    def written(self, notes: Iterable[tuple[str, str]]) -> None:
        self._unwritten.difference_update(identity for identity, _ in notes)

    def _count(self, identity: str, now: float) -> int:
        key = (identity, self.boot_id)
        boots = self._boots.get(key)
        if boots is None:
            seen, noted = self._journal.fatal_boots(identity, self.boot_id, now - self._s.escalation_window_seconds)
            boots = self._boots[key] = seen if noted else seen + 1  # this boot counts from its first sighting
            if not noted:
                self._unwritten.add(identity)
        return boots
