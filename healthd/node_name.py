"""The node's one name on every channel: the hook push, the fault metrics the alert rules carry, the webhook.

A standby-replacement hook dedups per node, so the daemon must name its node the same way wherever a fault leaves
it. The name is ``[daemon] node_name`` when set (``[hook] node_name``, the older spelling, when only that is set);
else ``NODE_NAME``, which the DaemonSet sets from ``spec.nodeName``; else the host name as kubelet derives a node
name from it when no ``--hostname-override`` is given: trimmed and lower-cased (kubernetes/kubernetes,
staging/src/k8s.io/component-helpers/node/util/hostname.go, ``GetHostname``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping


def canonical_node_name(
    *configured: str,
    environ: Mapping[str, str] = os.environ,
    hostname: Callable[[], str] = socket.gethostname,
) -> str:
    """The first non-empty ``configured`` name, else NODE_NAME, else the lower-cased host name."""
    for name in (*configured, environ.get("NODE_NAME", "")):
        if name.strip():
            return name.strip()
    return hostname().strip().lower()


__all__ = ["canonical_node_name"]
