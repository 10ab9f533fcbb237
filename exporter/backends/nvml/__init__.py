"""The real backend: NVML through pynvml (nvidia-ml-py).

``calls.py`` runs one NVML call and translates its errors; ``fields.py`` is the per-cycle field-value batch;
``device.py`` holds :class:`NvmlBackend`, which owns the handles and per-card caches; ``mig.py``, ``processes.py``,
``profiling.py`` (GPM) and ``events.py`` (XID and ECC events) read one concern each; ``cards.py`` decides when a
card's caches and event registration have gone stale.
"""

from exporter.backends.nvml.device import NvmlBackend

__all__ = ["NvmlBackend"]
