"""gradsyncctl's view of the daemon, from Python: status, metrics, the
connections, and the trace.

    with gradsync.Control() as ctl:
        print(ctl.status()["job_state"], ctl.metrics().count("\\n"))
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Dict, List, Optional

from . import _lib
from .client import DEFAULT_TIMEOUT, SessionInfo, _connect_error, _Connection, _Handle, _timeout_ms


def _struct_dict(s: ctypes.Structure) -> Dict[str, Any]:
    return {f[0]: _value(getattr(s, f[0])) for f in s._fields_}


def _value(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, ctypes.Structure):
        return _struct_dict(v)
    return v


class Control(_Connection):
    """A control connection: takes no trainer slot. Each call waits up to
    ``timeout`` seconds for the daemon's answer."""

    def __init__(self, socket_path: Optional[str] = None,
                 timeout: Optional[float] = DEFAULT_TIMEOUT):
        ptr = ctypes.c_void_p()
        self.timeout_ms = _timeout_ms(timeout)
        rc = _lib.lib().gs_control_connect(socket_path.encode() if socket_path else None,
                                           self.timeout_ms, ctypes.byref(ptr))
        if rc < 0:
            raise _connect_error(rc, "control_connect")
        self._handle = _Handle(ptr)

    def status(self) -> Dict[str, Any]:
        """The daemon's status as a dict (the fields of struct gs_status;
        ``trainers`` and ``peers`` as lists of dicts, ``settings`` with the
        wire dtype and op named)."""
        out = ctypes.POINTER(_lib.Status)()
        lib = _lib.lib()
        self._check(lib.gs_status_get(self._ptr(), self.timeout_ms, ctypes.byref(out)),
                    "status")
        try:
            s = out.contents
            d = {k: v for k, v in _struct_dict(s).items()
                 if k not in ("trainers", "peers", "settings")}
            d["settings"] = SessionInfo._from_c(s.settings).__dict__
            d["trainers"] = [_struct_dict(s.trainers[i]) for i in range(s.trainer_count)]
            d["peers"] = [_struct_dict(s.peers[i]) for i in range(s.peer_count)]
            return d
        finally:
            lib.gs_status_free(out)

    def metrics(self) -> str:
        """The daemon's figures in the Prometheus text exposition format."""
        text = ctypes.c_void_p()
        lib = _lib.lib()
        self._check(lib.gs_metrics_get(self._ptr(), self.timeout_ms, ctypes.byref(text)),
                    "metrics")
        try:
            return _lib.text(ctypes.string_at(text.value)) if text.value else ""
        finally:
            lib.gs_metrics_free(text)

    def clients(self) -> List[Dict[str, Any]]:
        """Every connection to the daemon, oldest first."""
        out = ctypes.POINTER(_lib.ConnectionStatus)()
        count = ctypes.c_size_t()
        lib = _lib.lib()
        self._check(lib.gs_clients_get(self._ptr(), self.timeout_ms, ctypes.byref(out),
                                       ctypes.byref(count)), "clients")
        try:
            return [_struct_dict(out[i]) for i in range(count.value)]
        finally:
            lib.gs_clients_free(out)

    def trace_start(self, path: str) -> Dict[str, Any]:
        """Starts a Chrome trace into ``path``, which this process opens
        (so the file is written with this process's rights)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            out = _lib.TraceStatus()
            self._check(_lib.lib().gs_trace_start(self._ptr(), fd, self.timeout_ms,
                                                  ctypes.byref(out)), "trace_start")
            return _struct_dict(out)
        finally:
            os.close(fd)

    def trace_stop(self) -> Dict[str, Any]:
        """Completes the trace; returns what it wrote."""
        out = _lib.TraceStatus()
        self._check(_lib.lib().gs_trace_stop(self._ptr(), self.timeout_ms,
                                             ctypes.byref(out)), "trace_stop")
        return _struct_dict(out)
