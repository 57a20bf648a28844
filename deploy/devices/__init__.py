"""Devices that run built modules: the local host, the ARM emulator, boards over SSH, OpenCL.

A device opens a session; a session loads a module file, runs it on numpy inputs and times it.
Backends register themselves when `get_device` first needs them (`registry.BACKENDS`), so
importing one backend (e.g. the OpenCL runner on a board) pulls in nothing of the others.
"""

from deploy.devices.registry import Device, DeviceLost, Session, get_device, register_device

__all__ = ["Device", "DeviceLost", "Session", "get_device", "register_device"]
