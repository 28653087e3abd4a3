"""gradsync from Python: the client library libgradsync, loaded with ctypes.

- ``gradsync.Client``: a trainer's connection (register tensors, steps);
- ``gradsync.launch_info()``: the job a trainer started here would join,
  and where each field came from (a dry run, to debug a launch script);
- ``gradsync.Control``: what gradsyncctl shows (status, metrics, trace);
- ``gradsync.torch``: ``GradSync(model)`` and ``backward_and_update_half``
  for PyTorch (imported on its own, so this package needs no PyTorch).

Errors raise ``gradsync.GradSyncError`` subclasses carrying the library's
code and message. The library is found as libgradsync.so.0 by the dynamic
linker, or at the path in $GRADSYNC_LIBRARY.
"""
from .client import (Client, LaunchInfo, SessionInfo, StateResult, StateSpec, Step, StepResult,
                     TensorSpec, launch_info)
from .control import Control
from .errors import (BufferError, ConnectError, DisconnectedError, DtypeError, GradSyncError,
                     InvalidArgumentError, LayoutError, LimitError, NoMemoryError,
                     ProtocolError, RefusedError, StateError, StepAborted, SystemCallError,
                     TimeoutError, strerror)

# meson's project version (tests/python/test_single_sources.py checks it).
__version__ = "0.1.0"

__all__ = [
    "Client", "Control", "LaunchInfo", "SessionInfo", "StateResult", "StateSpec", "Step",
    "StepResult", "TensorSpec",
    "launch_info",
    "GradSyncError", "BufferError", "ConnectError", "DisconnectedError", "DtypeError",
    "InvalidArgumentError", "LayoutError", "LimitError", "NoMemoryError", "ProtocolError",
    "RefusedError", "StateError", "StepAborted", "SystemCallError", "TimeoutError",
    "strerror",
]
