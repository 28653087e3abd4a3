"""gradsyncctl's view of the daemon, from Python: status, metrics, the
connections, and the trace.

    with gradsync.Control() as ctl:
        print(ctl.status()["job_state"], ctl.metrics().count("\\n"))
        for job in ctl.jobs():
            print(job.job_id, job.state, job.steps_completed)
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
from dataclasses import dataclass
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


@dataclass(frozen=True)
class JobStatus:
    """One job of the node (struct gs_job_status). Another user's job is
    ``hidden``: only ``state`` and ``trainers_connected`` are given, the
    other fields are 0, "" or empty. ``trainers`` and ``peers`` are dicts
    of struct gs_trainer_status and gs_peer_status."""

    job_id: str
    hidden: bool
    owner_uid: int
    state: str
    local_size: int
    nodes: int
    node_rank: int
    world_size: int
    coordinator: str
    threshold: int
    wire_dtype: str
    op: str
    predivide_factor: float
    fusion_buffer_elements: int
    backend: str
    trainers_connected: int
    trainers: List[Dict[str, Any]]
    buckets: int
    buckets_in_flight: int
    current_step: int
    steps_completed: int
    steps_aborted: int
    last_step_ns: int
    median_step_ns: int
    group_generation: int
    groups_built: int
    age_ns: int
    internode_bytes: int
    peers: List[Dict[str, Any]]

    @classmethod
    def _from_c(cls, c: _lib.JobStatus) -> "JobStatus":
        d = {k: v for k, v in _struct_dict(c).items()
             if k not in ("trainer_count", "peer_count")}
        d["wire_dtype"] = _lib.WIRE_DTYPES.get(c.wire_dtype, str(c.wire_dtype))
        d["op"] = _lib.REDUCE_OPS.get(c.op, str(c.op))
        d["trainers"] = [_struct_dict(c.trainers[i]) for i in range(c.trainer_count)]
        d["peers"] = [_struct_dict(c.peers[i]) for i in range(c.peer_count)]
        return cls(**d)


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
        wire dtype and op named, ``jobs`` every job of the node as a dict of
        the fields of :class:`JobStatus`)."""
        out = ctypes.POINTER(_lib.Status)()
        lib = _lib.lib()
        self._check(lib.gs_status_get(self._ptr(), self.timeout_ms, ctypes.byref(out)),
                    "status")
        try:
            s = out.contents
            d = {k: v for k, v in _struct_dict(s).items()
                 if k not in ("trainers", "peers", "settings", "jobs")}
            d["settings"] = SessionInfo._from_c(s.settings).__dict__
            d["trainers"] = [_struct_dict(s.trainers[i]) for i in range(s.trainer_count)]
            d["peers"] = [_struct_dict(s.peers[i]) for i in range(s.peer_count)]
            d["jobs"] = [dataclasses.asdict(JobStatus._from_c(s.jobs[i]))
                         for i in range(s.job_count)]
            return d
        finally:
            lib.gs_status_free(out)

    def jobs(self) -> List[JobStatus]:
        """Every job the node serves, in the daemon's order; another
        user's job is hidden."""
        out = ctypes.POINTER(_lib.Status)()
        lib = _lib.lib()
        self._check(lib.gs_status_get(self._ptr(), self.timeout_ms, ctypes.byref(out)),
                    "status")
        try:
            s = out.contents
            return [JobStatus._from_c(s.jobs[i]) for i in range(s.job_count)]
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
