"""Devices that run built modules: the local host, the ARM emulator, boards over SSH, OpenCL.

A device opens a session; a session loads a module file, runs it on numpy inputs and times it.
"""

from devices.registry import Device, DeviceLost, Session, get_device, register_device

__all__ = ["Device", "DeviceLost", "Session", "get_device", "register_device"]

from devices import emulator, local, opencl, ssh  # noqa: F401  (registration on import)
