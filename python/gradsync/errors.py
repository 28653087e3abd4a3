"""Exceptions carrying libgradsync's error code and message.

Every failure of a call into the library raises a GradSyncError (or a
subclass chosen by its code) whose ``code`` is the library's GS_E* value,
``name`` its name ("GS_ELAYOUT") and ``message`` the library's
gs_last_error text, which includes what the daemon said.
"""
from __future__ import annotations

import builtins
from typing import Any, Dict, Optional, Type

from . import _lib

# The error codes: GS_ERRNO_MAP in gradsync's proto/client_protocol.h, from
# which the C enum, gs_strerror and gs_err_name are made. This copy must
# name the same codes with the same values: tests/python/test_single_sources.py
# fails on any difference.
OK = 0
EINVAL = -1
ENOMEM = -2
ECONNECT = -3
EDISCONNECTED = -4
ETIMEDOUT = -5
EPROTO = -6
EVERSION = -7
EDTYPE = -8
ELAYOUT = -9
EBUFFER = -10
ELIMIT = -11
ESTATE = -12
EABORTED = -13
EAGAIN = -14
ESYSTEM = -15
EREFUSED = -16


class GradSyncError(Exception):
    """A libgradsync call failed."""

    code: int = 0

    def __init__(self, code: int, message: str, call: str = ""):
        self.code = code
        self.name = _lib.text(_lib.lib().gs_err_name(code))
        self.message = message
        self.call = call
        where = f"{call}: " if call else ""
        super().__init__(f"{where}{message} ({self.name})")


class InvalidArgumentError(GradSyncError, ValueError):
    """GS_EINVAL: an argument the library or the daemon refused."""


class NoMemoryError(GradSyncError, MemoryError):
    """GS_ENOMEM."""


class ConnectError(GradSyncError, ConnectionError):
    """GS_ECONNECT: gradsyncd is not reachable on the socket."""


class DisconnectedError(GradSyncError, ConnectionError):
    """GS_EDISCONNECTED: gradsyncd closed the connection (reconnect())."""


class TimeoutError(GradSyncError, builtins.TimeoutError):
    """GS_ETIMEDOUT."""


class ProtocolError(GradSyncError):
    """GS_EPROTO or GS_EVERSION: the two sides do not understand each other."""


class DtypeError(GradSyncError, TypeError):
    """GS_EDTYPE: a tensor of a dtype gradsync does not reduce."""


class LayoutError(GradSyncError):
    """GS_ELAYOUT: this trainer's tensors differ from the other trainers'."""


class BufferError(GradSyncError):
    """GS_EBUFFER: a buffer the daemon could not use."""


class LimitError(GradSyncError):
    """GS_ELIMIT: a limit of the daemon (tensors, bytes, clients)."""


class StateError(GradSyncError):
    """GS_ESTATE: a call out of order (a step already running, ...)."""


class StepAborted(GradSyncError):
    """GS_EABORTED: the step was aborted; ``result`` has its figures, and
    ``Client.tensor_reduced()`` tells which tensors hold reduced values."""

    result: Optional[Any] = None  # a gradsync.StepResult


class RefusedError(GradSyncError, PermissionError):
    """GS_EREFUSED: gradsyncd refused this client (access, limits)."""


class SystemCallError(GradSyncError, OSError):
    """GS_ESYSTEM: a system call failed."""


_BY_CODE: Dict[int, Type[GradSyncError]] = {
    EINVAL: InvalidArgumentError,
    ENOMEM: NoMemoryError,
    ECONNECT: ConnectError,
    EDISCONNECTED: DisconnectedError,
    ETIMEDOUT: TimeoutError,
    EPROTO: ProtocolError,
    EVERSION: ProtocolError,
    EDTYPE: DtypeError,
    ELAYOUT: LayoutError,
    EBUFFER: BufferError,
    ELIMIT: LimitError,
    ESTATE: StateError,
    EABORTED: StepAborted,
    ESYSTEM: SystemCallError,
    EREFUSED: RefusedError,
}


def error_for(code: int, message: str, call: str = "") -> GradSyncError:
    """The exception for a library return code."""
    return _BY_CODE.get(code, GradSyncError)(code, message, call)


def strerror(code: int) -> str:
    """The library's description of an error code."""
    return _lib.text(_lib.lib().gs_strerror(code))
