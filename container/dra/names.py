"""Names the driver publishes under: the driver (DRA's name for it, also the attribute domain), the standard
attribute names of k8s.io/dynamic-resource-allocation/deviceattribute (KEP-6072 for numaNode), and the taint key."""

from __future__ import annotations

DRIVER = "gpu.xpu-runtime-kit.io"

# k8s.io/dynamic-resource-allocation deviceattribute/attribute.go (StandardDeviceAttributePrefix ...)
STANDARD_PREFIX = "resource.kubernetes.io/"
PCIE_ROOT = STANDARD_PREFIX + "pcieRoot"  # "pci<domain>:<bus>" of the root complex
PCI_BUS_ID = STANDARD_PREFIX + "pciBusID"  # extended BDF, "0000:18:00.0"
NUMA_NODE = STANDARD_PREFIX + "numaNode"  # int (KEP-6072, stable in 1.37; a plain attribute name before)

# Unqualified attribute and capacity names belong to the driver's domain (DRA CEL: device.attributes[DRIVER].uuid).
UUID = "uuid"
INDEX = "index"
PRODUCT = "product"
ARCHITECTURE = "architecture"
DRIVER_VERSION = "driverVersion"
NVLINK_DOMAIN = "nvlinkDomain"
MODE = "mode"  # none, tdm or mig: which DeviceClass a device belongs to
TDM_SHARING = "tdmSharing"
PARENT_UUID = "parentUUID"  # MIG: the card's UUID (the instance has none until it is created)
MIG_PROFILE = "profile"
MIG_PROFILE_ID = "profileID"
PLACEMENT_START = "placementStart"
PLACEMENT_SIZE = "placementSize"

MEMORY = "memory"
COMPUTE = "compute"  # TDM: percent of the card
MULTIPROCESSORS = "multiprocessors"  # MIG: SMs of the instance

FAULT_TAINT_KEY = "xpu-runtime-kit.io/fault"
UNMONITORED = "unmonitored"  # the taint value while the daemon cannot be reached
