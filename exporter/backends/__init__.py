"""GPU backends: the Backend protocol, the real NVML backend and the simulated one."""

from exporter.backends.errors import BackendError
from exporter.backends.protocol import Backend

__all__ = ["Backend", "BackendError"]
