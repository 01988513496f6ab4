"""autoconfig: find the fastest parallel configuration to train and serve a transformer."""

from autoconfig.api import estimate, estimate_frame, search

__all__ = ["estimate", "estimate_frame", "search"]
__version__ = "0.1.0"
