"""Devices that run built modules: the local host (more in later backends).

A device opens a session; a session loads a module file, runs it on numpy inputs and times it.
"""

from devices.registry import Device, Session, all_devices, get_device, register_device

__all__ = ["Device", "Session", "all_devices", "get_device", "register_device"]

from devices import local  # noqa: F401  (registration on import)
