"""stopserve: learned continue-or-stop decisions for multi-agent LLM orchestrators."""

from stopserve.errors import StopServeError
from stopserve.trace import Event, Trace, read_traces, write_traces

__version__ = "0.1.0"

__all__ = [
    "Event",
    "StopServeError",
    "Trace",
    "__version__",
    "read_traces",
    "write_traces",
]
