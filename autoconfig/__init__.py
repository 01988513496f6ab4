"""autoconfig: find the fastest parallel configuration to train and serve a transformer."""

from __future__ import annotations

from typing import Any

__all__ = ["estimate", "estimate_frame", "infer", "infer_frame", "search"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy, so that processes needing one submodule (a trial's rank unpickling its task) do
    # not pay for pandas and the cost model at start-up.
    if name in __all__:
        from autoconfig import api

        return getattr(api, name)
    raise AttributeError(f"module 'autoconfig' has no attribute {name!r}")
