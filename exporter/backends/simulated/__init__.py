"""The simulated GPU node: a scenario file played as NVML would answer it, with fault injection at run time.

``backend.py`` holds :class:`SimulatedBackend`; ``card.py`` the state of one card and the model that moves its
values; ``mig.py`` MIG with NVML's placement rules; ``profiling.py`` the GPM model; ``injector.py`` the fault kinds
and :class:`SimulatedInjector` (the backend's ``injector``).
"""

from exporter.backends.simulated.backend import SimulatedBackend
from exporter.backends.simulated.card import PodPlacement, SimulatedWorkload
from exporter.backends.simulated.injector import FAULT_PARAMS, SimulatedInjector

__all__ = ["FAULT_PARAMS", "PodPlacement", "SimulatedBackend", "SimulatedInjector", "SimulatedWorkload"]
