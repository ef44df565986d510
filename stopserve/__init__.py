"""stopserve: learned continue-or-stop decisions for multi-agent LLM orchestrators.

>>> from stopserve import RunState, Policy
>>> state = RunState()
>>> Policy.safety_only().decide(state).action
'continue'

The public names are imported on first use (PEP 562), so ``import stopserve`` and
the short-lived ``stopserve hook`` process pay for numpy, pydantic or httpx only
when a name that needs them is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stopserve.client import AsyncStopClient, EventRecorder, StopClient
    from stopserve.decision import StopDecision
    from stopserve.errors import StopServeError
    from stopserve.features import FEATURE_NAMES, RunState
    from stopserve.manifest import Manifest
    from stopserve.objective import Objective
    from stopserve.policy import Policy
    from stopserve.safety import LoopConfig, SafetyConfig, SafetyStop
    from stopserve.trace import Event, Trace, TraceWriter, read_traces, scan, write_traces

__version__ = "0.1.0"

__all__ = [
    "AsyncStopClient",
    "Event",
    "EventRecorder",
    "FEATURE_NAMES",
    "LoopConfig",
    "Manifest",
    "Objective",
    "Policy",
    "RunState",
    "SafetyConfig",
    "SafetyStop",
    "StopClient",
    "StopDecision",
    "StopServeError",
    "Trace",
    "TraceWriter",
    "__version__",
    "read_traces",
    "scan",
    "write_traces",
]

# public name -> module that defines it
_HOMES = {
    "AsyncStopClient": "stopserve.client",
    "EventRecorder": "stopserve.client",
    "StopClient": "stopserve.client",
    "StopServeError": "stopserve.errors",
    "FEATURE_NAMES": "stopserve.features",
    "RunState": "stopserve.features",
    "Manifest": "stopserve.manifest",
    "Objective": "stopserve.objective",
    "Policy": "stopserve.policy",
    "StopDecision": "stopserve.decision",
    "LoopConfig": "stopserve.safety",
    "SafetyConfig": "stopserve.safety",
    "SafetyStop": "stopserve.safety",
    "Event": "stopserve.trace",
    "Trace": "stopserve.trace",
    "TraceWriter": "stopserve.trace",
    "read_traces": "stopserve.trace",
    "scan": "stopserve.trace",
    "write_traces": "stopserve.trace",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'stopserve' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
