"""Inter-process channels: lock-free single-producer single-consumer rings in shared memory,
carrying slot indices, request tuples and small reports."""

from fastrl.ipc.channels import Channels, put_report
from fastrl.ipc.rings import Doorbell, IntRing, MsgRing, wait_any

__all__ = ["Channels", "Doorbell", "IntRing", "MsgRing", "put_report", "wait_any"]
