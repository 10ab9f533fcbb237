"""tests/support/dra_cel.py: the examples of k8s.io/apiserver pkg/cel/library quantity.go and semverlib.go give
Kubernetes' answers, and the DRA device variable behaves as dynamic-resource-allocation cel/compile.go says."""

from __future__ import annotations

import pytest

from tests.support.dra_cel import CelCompileError, CelRuntimeError, Selector

DRIVER = "gpu.xpu-runtime-kit.io"
DEVICE = {
    "name": "gpu-0",
    "attributes": {
        "product": {"string": "NVIDIA H200"},
        "driverVersion": {"version": "580.159.4"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
    },
    "capacity": {"memory": {"value": "143771Mi"}},
}


@pytest.mark.parametrize(
    "expression",
    [
        'quantity("200M").compareTo(quantity("0.2G")) == 0',
        'quantity("50M").compareTo(quantity("50Mi")) == -1',
        'quantity("150Mi").isGreaterThan(quantity("100Mi"))',
        'quantity("50k").add(20).sub(quantity("100k")).sub(-50000) == quantity("20")',
        'quantity("50k").sub(20000).asApproximateFloat() == 30000.0',
        'quantity("50000000G").isInteger() && !quantity("9999999999999999999999999999999999999G").isInteger()',
        'isQuantity("1.3Gi") && !isQuantity("1,3G") && !isQuantity("200K") && !isQuantity("Mi")',
        'quantity("1Gi") == quantity("1024Mi")',
        'semver("1.2.3").compareTo(semver("2.0.0")) == -1 && semver("1.2.3").compareTo(semver("0.1.2")) == 1',
        'semver("1.0.0-alpha.1").isLessThan(semver("1.0.0-alpha.beta"))',
        'semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))',
        'semver("v1.0", true) == semver("1.0.0") && semver("01.01.01", true) == semver("1.1.1")',
        'semver("1.2.3+build.5") == semver("1.2.3") && !isSemver("v1.0") && isSemver("v1.0", true)',
    ],
)
def test_the_kubernetes_libraries_answer_as_documented(expression: str) -> None:
    assert Selector(expression).matches(DRIVER, DEVICE) is True


def test_the_device_variable_is_the_schedulers() -> None:
    matches = Selector(
        'device.driver == "gpu.xpu-runtime-kit.io" && '
        'device.attributes["gpu.xpu-runtime-kit.io"].driverVersion.isGreaterThan(semver("550.0.0")) && '
        'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:15" && '
        'device.capacity["gpu.xpu-runtime-kit.io"].memory.compareTo(quantity("140Gi")) >= 0 && '
        "!device.allowMultipleAllocations"
    ).matches
    assert matches(DRIVER, DEVICE) is True
    assert matches("other.example.com", DEVICE) is False  # unqualified names belong to the device's driver
    assert Selector('"x" in device.attributes["other.example.com"]').matches(DRIVER, DEVICE) is False


def test_errors_are_errors_unless_the_logic_absorbs_them() -> None:
    with pytest.raises(CelRuntimeError):
        Selector('device.attributes["gpu.xpu-runtime-kit.io"].missing == 1').matches(DRIVER, DEVICE)
    with pytest.raises(CelRuntimeError):
        Selector('quantity("200K") == quantity("1")').matches(DRIVER, DEVICE)
    assert Selector('device.driver == "x" && device.attributes["x"].y == 1').matches(DRIVER, DEVICE) is False
    with pytest.raises(CelCompileError):
        Selector('"not a bool"')
