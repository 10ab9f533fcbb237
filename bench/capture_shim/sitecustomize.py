"""pynvml answering from the real H200 capture in any Python process that has this directory and the repository on
PYTHONPATH (bench/peers_bench.py runs xpu-healthd's NVML backend and nvitop-exporter over it, side by side).

The answers are tests/support/nvml_capture_fake.py's, installed before anything imports pynvml's members. Around it,
for a peer that calls more of pynvml than NvmlBackend does:

- every other ``nvml*`` function answers NOT_SUPPORTED, as a driver without that feature would, and
  ``_nvmlGetFunctionPointer`` is left out, so nvitop takes pynvml's own wrappers (which the fake answers) instead of
  raw function pointers into a library that is not there;
- ``nvmlInitWithFlags`` is ``nvmlInit``, ``nvmlDeviceIsMigDeviceHandle`` says no (the captured card has MIG off)
  and ``nvmlDeviceGetPowerManagementLimit`` is the enforced limit the capture has;
- an event wait with nothing queued sleeps out its timeout first, as the driver does (the fake answers at once,
  which would make an XID thread spin).

It proves nothing about a driver: both peers pay the same Python-side costs over the same answers.
"""

from __future__ import annotations

import os
import time
import types

if os.environ.get("XPU_CAPTURE_SHIM") == "1":
    import pynvml
    import pytest

    from tests.support.nvml_capture_fake import MODELLED_CALLS, install

    _fake = install(pytest.MonkeyPatch())

    def _unsupported(name: str):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

        call.__name__ = name
        return call

    _KEEP = {*MODELLED_CALLS, "nvmlExceptionClass", "nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct"}
    for _name, _value in list(vars(pynvml).items()):  # functions only: structures and constants stay
        if _name.startswith("nvml") and isinstance(_value, types.FunctionType) and _name not in _KEEP:
            setattr(pynvml, _name, _unsupported(_name))
    pynvml._nvmlGetFunctionPointer = None
    pynvml.nvmlInitWithFlags = lambda flags=0: pynvml.nvmlInit()
    pynvml.nvmlDeviceIsMigDeviceHandle = lambda handle: False
    pynvml.nvmlDeviceGetPowerManagementLimit = pynvml.nvmlDeviceGetEnforcedPowerLimit

    _wait = pynvml.nvmlEventSetWait_v2

    def _wait_out(event_set, timeoutms):  # type: ignore[no-untyped-def]
        try:
            return _wait(event_set, timeoutms)
        except pynvml.NVMLError as err:
            if err.value == pynvml.NVML_ERROR_TIMEOUT:
                time.sleep(timeoutms / 1000)
            raise

    pynvml.nvmlEventSetWait_v2 = _wait_out
