"""The text `xpuctl simulate kinds` shows covers exactly the kinds and parameters the simulated node accepts."""

from __future__ import annotations

from exporter.backends.simulated import FAULT_PARAMS
from exporter.backends.simulated.fault_docs import FAULT_DOCS


def test_every_kind_and_parameter_is_described() -> None:
    assert set(FAULT_DOCS) == set(FAULT_PARAMS)
    for kind, params in FAULT_PARAMS.items():
        doc = FAULT_DOCS[kind]
        assert doc.summary, kind
        assert set(doc.params) == set(params), kind
        for name, p in doc.params.items():
            assert p.meaning and p.allowed, (kind, name)
