"""Inter-process messaging: faster-fifo queues carrying indices and small messages."""

from fastrl.ipc.channels import Channels, get_many, put_report

__all__ = ["Channels", "get_many", "put_report"]
