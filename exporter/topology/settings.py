"""[topology]: how often the layout is read and how long a reading may take, the NFD feature file and the
operator's network levels (docs/topology.md). The refresher runs on it as read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exporter.settings import InvalidKeyError, option
from exporter.topology.nfd import DEFAULT_NAMESPACE, valid_label_value, valid_level_name, valid_namespace

DEFAULT_NFD_FEATURE_FILE = "/etc/kubernetes/node-feature-discovery/features.d/xpu-runtime-kit"


def _feature_file(value: str) -> None:
    if value and (not value.startswith("/") or Path(value).name.startswith(".")):
        raise ValueError(f"must be an absolute path to a file not starting with '.', got {value[:200]!r}")


def _namespace(value: str) -> None:
    if not valid_namespace(value):
        raise ValueError(f"not a DNS subdomain: {value[:200]!r}")


def _network(levels: tuple[tuple[str, str], ...]) -> None:
    for level, value in levels:
        if not valid_level_name(level):
            raise InvalidKeyError(level, "level names are lower-case letters, digits and '-'")
        if not value or not valid_label_value(value):
            raise InvalidKeyError(
                level,
                f"expected a label value (1-63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends), got {value[:100]!r}",
            )


@dataclass(frozen=True, slots=True)
class TopologySettings:
    """[topology]: how often the layout is read, the NFD feature file and the operator's network levels."""

    enabled: bool = True
    refresh_seconds: float = option(3600.0, min=10, max=7 * 86400)
    # the whole collection (each NVLink read has the device layer's read deadline)
    deadline_seconds: float = option(10.0, min=0.1, max=600)
    # Written only when its directory exists (NFD installed); "" disables.
    nfd_feature_file: str = option(DEFAULT_NFD_FEATURE_FILE, check=_feature_file)
    label_namespace: str = option(DEFAULT_NAMESPACE, check=_namespace)
    network: tuple[tuple[str, str], ...] = option((), check=_network)  # e.g. [topology.network] block = "b07"
