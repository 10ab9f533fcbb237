"""The driver's GPU recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``), decoded by driver branch.

NVML renumbered ``nvmlDeviceGpuRecoveryAction_t`` between branches, so a raw value means nothing without the
branch that produced it. What each branch defines (NVML's change log, and ``pynvml.py`` of the nvidia-ml-py release
of that branch: 12.570.86, 12.575.51, 13.580.65 to .126, 13.590.48, 13.595.45, 13.610.43, 13.615.71):

====================  ===============================================================================
branch                raw values
====================  ===============================================================================
before 565            the field does not exist (the card answers NotSupported)
565                   0 none, 1 GPU reset, 2 node reboot, 3 drain peer-to-peer
570, 575              as 565, plus 4 drain and reset
580                   as 570, plus 5 bus reset (``NVML_GPU_RECOVERY_ACTION_GPU_RESET_BUS``, 13.580.x)
590                   0-4 only (13.590.x dropped ``GPU_RESET_BUS``)
595 to 610            0-4, plus 5 recover the IMEX domain (``RECOVER_IMEX_DOMAIN``; change log of 595)
615 and later         0-5 as 595, plus 6 bus reset and 7 system reboot (``BUS_RESET``, ``SYSTEM_REBOOT``)
====================  ===============================================================================

So raw 5 is "reset the GPU's bus" on R580 and "recover the IMEX domain" from R595 on. :class:`RecoveryAction` is
the branch-independent code the daemon exports and judges: NVML's newest numbering (615). Values 0-4 mean the same
on every branch; a value the branch does not define decodes to ``None`` (unknown), never to a guess.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final


class RecoveryAction(enum.IntEnum):
    """The recovery the driver asks for, numbered as NVML 615 does (the code ``xpu_gpu_recovery_action`` exports)."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def text(self) -> str:
        """For a person: ``"bus reset"``, ``"drain peer-to-peer"``."""
        return _TEXT.get(self, self.label.replace("_", " "))


_TEXT: Final = {
    RecoveryAction.GPU_RESET: "GPU reset",
    RecoveryAction.DRAIN_P2P: "drain peer-to-peer",
    RecoveryAction.RECOVER_IMEX_DOMAIN: "IMEX domain recovery",
}
UNKNOWN_RECOVERY_CODE: Final = -1  # what the metric shows for a raw value the driver's branch does not define

_A = RecoveryAction
_BASE: Final = {0: _A.NONE, 1: _A.GPU_RESET, 2: _A.NODE_REBOOT, 3: _A.DRAIN_P2P}
_WITH_DRAIN_RESET: Final = {**_BASE, 4: _A.DRAIN_AND_RESET}

# (first branch, raw value -> action), oldest first; a branch uses the last table whose first branch it reaches.
BRANCH_TABLES: Final[tuple[tuple[int, Mapping[int, RecoveryAction]], ...]] = (
    (565, MappingProxyType(_BASE)),
    (570, MappingProxyType(_WITH_DRAIN_RESET)),
    (580, MappingProxyType({**_WITH_DRAIN_RESET, 5: _A.BUS_RESET})),
    (590, MappingProxyType(_WITH_DRAIN_RESET)),
    (595, MappingProxyType({**_WITH_DRAIN_RESET, 5: _A.RECOVER_IMEX_DOMAIN})),
    (615, MappingProxyType({**_WITH_DRAIN_RESET, 5: _A.RECOVER_IMEX_DOMAIN, 6: _A.BUS_RESET, 7: _A.SYSTEM_REBOOT})),
)

# What can be trusted without a branch: raw values every branch from 570 on defines, each with one meaning (0-4).
_BRANCH_FREE: Final = MappingProxyType(
    {
        raw: action
        for raw, action in BRANCH_TABLES[-1][1].items()
        if all(table.get(raw) is action for first, table in BRANCH_TABLES if first >= 570)
    }
)

_BRANCH_RE: Final = re.compile(r"^\s*(\d+)(?:\.|\s*$)")


def driver_branch(driver_version: str | None) -> int | None:
    """``"580.159.04"`` -> 580; None when the version is missing or not NVIDIA's ``major.minor[.patch]`` form."""
    if not driver_version:
        return None
    match = _BRANCH_RE.match(driver_version)
    return int(match.group(1)) if match else None


def recovery_table(driver_version: str | None) -> Mapping[int, RecoveryAction]:
    """The raw-value table of the driver's branch; only the values every branch agrees on when it is unknown."""
    branch = driver_branch(driver_version)
    if branch is None:
        return _BRANCH_FREE
    table: Mapping[int, RecoveryAction] = BRANCH_TABLES[0][1]  # older than 565: the field is NotSupported anyway
    for first, candidate in BRANCH_TABLES:
        if branch >= first:
            table = candidate
    return table


def decode_recovery_action(raw: int, driver_version: str | None) -> RecoveryAction | None:
    """The action a raw ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` value stands for on this driver; None if unknown."""
    return recovery_table(driver_version).get(raw)


def recovery_code(raw: int, driver_version: str | None) -> int:
    """The branch-independent code for the metric: a :class:`RecoveryAction` value, or -1 when unknown."""
    action = decode_recovery_action(raw, driver_version)
    return UNKNOWN_RECOVERY_CODE if action is None else int(action)


__all__ = [
    "BRANCH_TABLES",
    "UNKNOWN_RECOVERY_CODE",
    "RecoveryAction",
    "decode_recovery_action",
    "driver_branch",
    "recovery_code",
    "recovery_table",
]
