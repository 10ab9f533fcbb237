"""The node's canonical name: configured, else NODE_NAME (the DaemonSet's spec.nodeName), else kubelet's rule."""

from __future__ import annotations

from healthd.node_name import canonical_node_name


def test_the_configured_name_wins_then_the_older_spelling() -> None:
    env = {"NODE_NAME": "from-env"}
    assert canonical_node_name("gpu-node-7", "old", environ=env, hostname=lambda: "H") == "gpu-node-7"
    assert canonical_node_name("", "old", environ=env, hostname=lambda: "H") == "old"


def test_node_name_from_the_environment_as_the_daemonset_passes_it() -> None:
    assert canonical_node_name("", environ={"NODE_NAME": "ip-10-0-0-5.ec2.internal"}, hostname=lambda: "x") == (
        "ip-10-0-0-5.ec2.internal"
    )


def test_the_host_name_as_kubelet_derives_the_node_name_lower_cased_and_trimmed() -> None:
    assert canonical_node_name("", environ={}, hostname=lambda: " GPU-Node-7.Example.COM\n") == "gpu-node-7.example.com"
    assert canonical_node_name("  ", environ={"NODE_NAME": " "}, hostname=lambda: "VM") == "vm"
