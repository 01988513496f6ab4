"""autoconfig: find the fastest parallel configuration to train and serve a transformer."""

from autoconfig.api import estimate, estimate_frame

__all__ = ["estimate", "estimate_frame"]
__version__ = "0.1.0"
