"""stopserve: learned continue-or-stop decisions for multi-agent LLM orchestrators.

>>> from stopserve import RunState, Policy
>>> state = RunState()
>>> Policy.safety_only().decide(state).action
'continue'
"""

from stopserve.client import AsyncStopClient, EventRecorder, StopClient
from stopserve.errors import StopServeError
from stopserve.features import FEATURE_NAMES, RunState
from stopserve.policy import Policy, StopDecision
from stopserve.safety import LoopConfig, SafetyConfig, SafetyStop
from stopserve.trace import Event, Trace, TraceWriter, read_traces, scan, write_traces

__version__ = "0.1.0"

__all__ = [
    "AsyncStopClient",
    "Event",
    "EventRecorder",
    "FEATURE_NAMES",
    "LoopConfig",
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
