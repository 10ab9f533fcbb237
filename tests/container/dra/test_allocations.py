"""tests/support/dra_allocations.py: every sample claim is a valid resource.k8s.io/v1 ResourceClaim for 1.36 and
1.37 (through the stand-in's write validation), and reads back through the official client's models."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.support import dra_allocations as samples
from tests.support.kube_api import KubeApiServer

NODE = "h200x8"
POD = ("train-0", "6f1c2b1e-9d7a-4c35-8f0e-2a4b6c8d0e11")


@pytest.fixture
def server() -> Iterator[KubeApiServer]:
    with KubeApiServer() as srv:
        yield srv


def every_sample() -> list[dict[str, object]]:
    return [
        samples.whole_card("whole", "team", NODE, "gpu-0", POD),
        samples.tdm_share("tdm-30", "team", NODE, "gpu-3-tdm", POD, compute="30", memory="2Gi"),
        samples.tdm_share("tdm-50", "team", NODE, "gpu-3-tdm", POD, compute="50", memory="8Gi"),
        samples.mig_partition("mig", "team", NODE, "gpu-6-mig-1g-18gb-2", POD),
        samples.tolerating(samples.whole_card("tolerant", "team", NODE, "gpu-2", POD), "xid_79"),
        samples.extended_resource("team", NODE, ["gpu-0", "gpu-1"], POD),
    ]


def test_every_sample_is_a_valid_claim_in_both_versions(server: KubeApiServer) -> None:
    api = client.ResourceV1Api(client.ApiClient(client.Configuration(host=server.url)))
    for sample in every_sample():
        server.add("resourceclaims", sample, "team")
    assert server.rejected == []
    read = {c.metadata.name: c for c in api.list_namespaced_resource_claim("team").items}
    share = read["tdm-30"].status.allocation.devices.results[0]
    assert (share.consumed_capacity, len(share.share_id)) == ({"compute": "30", "memory": "2Gi"}, 36)
    assert read["tolerant"].status.allocation.devices.results[0].tolerations[0].value == "xid_79"
    assert read["whole"].status.reserved_for[0].uid == POD[1]


def test_a_claim_the_schemas_refuse_is_refused(server: KubeApiServer) -> None:
    bad = samples.whole_card("bad", "team", NODE, "gpu-0", POD)
    bad["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {"compute": {"value": "30"}}
    with pytest.raises(Exception, match="is invalid"):
        server.add("resourceclaims", bad, "team")
    assert "consumedCapacity" in server.rejected[0][1]
