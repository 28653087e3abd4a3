"""The ctypes binding of libgradsync: the C structs of gradsync.h, the
functions' signatures, and the one place that finds the library.

Nothing here is public; gradsync.client and gradsync.control wrap it.
Each Structure below mirrors its C struct field for field (ctypes applies
the platform's C alignment), and tests/python/test_abi.py checks their
sizes and offsets, and the enum values and macros copied below, against
what the C compiler says.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_bool, c_char, c_char_p, c_double,
                    c_float, c_int, c_int32, c_size_t, c_uint32, c_uint64,
                    c_void_p)
from typing import Optional

# ---- structs -----------------------------------------------------------------


class ConnectOptions(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("socket_path", c_char_p),
        ("local_rank", c_uint32),
        ("job_id", c_char_p),
        ("timeout_ms", c_int),
        ("local_size", c_uint32),
        ("nodes", c_uint32),
        ("node_rank", c_uint32),
        ("coordinator", c_char_p),
        # The job's settings (0, or FROM_ENV_U64 / < 0: from the environment).
        ("threshold", c_uint64),
        ("wire_dtype", c_int),
        ("op", c_int),
        ("predivide_factor", c_double),
        ("fusion_buffer_elements", c_uint64),
    ]


# GS_FROM_ENV: a number field of ConnectOptions left to the environment.
FROM_ENV = 0xFFFFFFFF
# GS_FROM_ENV_U64: the threshold left to the environment.
FROM_ENV_U64 = 0xFFFFFFFFFFFFFFFF
_SOURCE = c_char * 48  # GS_LAUNCH_SOURCE_MAX


class LaunchInfo(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("job_id", c_char * 64),
        ("job_id_source", _SOURCE),
        ("local_rank", c_uint32),
        ("local_rank_source", _SOURCE),
        ("local_size", c_uint32),
        ("local_size_source", _SOURCE),
        ("nodes", c_uint32),
        ("nodes_source", _SOURCE),
        ("node_rank", c_uint32),
        ("node_rank_source", _SOURCE),
        ("coordinator", c_char * 256),  # GS_COORDINATOR_MAX + 1
        ("coordinator_source", _SOURCE),
        ("threshold", c_uint64),
        ("threshold_source", _SOURCE),
        ("wire_dtype", c_int),
        ("wire_dtype_source", _SOURCE),
        ("op", c_int),
        ("op_source", _SOURCE),
        ("predivide_factor", c_double),
        ("predivide_source", _SOURCE),
        ("fusion_buffer_elements", c_uint64),
        ("fusion_buffer_source", _SOURCE),
    ]


class SessionInfo(Structure):
    _fields_ = [
        ("world_size", c_uint32),
        ("local_size", c_uint32),
        ("node_rank", c_uint32),
        ("nodes", c_uint32),
        ("backend", c_char_p),
        ("daemon_version", c_char_p),
        ("threshold", c_uint64),
        ("wire_dtype", c_int),
        ("op", c_int),
        ("predivide_factor", c_double),
        ("fusion_buffer_elements", c_uint64),
        ("global_rank", c_uint32),
        ("local_rank", c_uint32),
    ]


class TensorSpec(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("count", c_uint64),
        ("dtype", c_int),
        ("memfd", c_int),
        ("offset", c_uint64),
    ]


class CudaTensorSpec(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("count", c_uint64),
        ("dtype", c_int),
        ("data", c_void_p),
    ]


class StateSpec(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("bytes", c_uint64),
        ("dtype", c_int),
        ("memfd", c_int),
        ("offset", c_uint64),
    ]


class CudaStateSpec(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("bytes", c_uint64),
        ("dtype", c_int),
        ("data", c_void_p),
    ]


class StateResult(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("bytes", c_uint64),
        ("duration_ns", c_uint64),
        ("tensors_done", c_uint32),
    ]


class StepOptions(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("clipping", c_bool),
        ("clip_value", c_float),
        ("bucket_events", c_bool),
    ]


class StepResult(Structure):
    _fields_ = [
        ("step", c_uint64),
        ("status", c_int),
        ("buckets", c_uint32),
        ("wire_bytes", c_uint64),
        ("clipped", c_uint64),
        ("nonfinite", c_uint64),
        ("duration_ns", c_uint64),
        ("grad_norm", c_double),
    ]


class TrainerStatus(Structure):
    _fields_ = [
        ("pid", c_uint32),
        ("uid", c_uint32),
        ("local_rank", c_uint32),
        ("tensors", c_uint32),
        ("bytes", c_uint64),
        ("steps", c_uint64),
        ("state", c_char * 32),
    ]


class PeerStatus(Structure):
    _fields_ = [
        ("node_rank", c_uint32),
        ("local_size", c_uint32),
        ("host", c_char * 64),
        ("state", c_char * 32),
    ]


class JobStatus(Structure):
    _fields_ = [
        ("job_id", c_char * 64),
        ("hidden", c_bool),
        ("owner_uid", c_uint32),
        ("state", c_char * 32),
        ("local_size", c_uint32),
        ("nodes", c_uint32),
        ("node_rank", c_uint32),
        ("world_size", c_uint32),
        ("coordinator", c_char * 263),  # GS_COORDINATOR_MAX + 8: HOST:PORT
        ("threshold", c_uint64),
        ("wire_dtype", c_int),
        ("op", c_int),
        ("predivide_factor", c_double),
        ("fusion_buffer_elements", c_uint64),
        ("backend", c_char * 16),
        ("trainers_connected", c_uint32),
        ("trainer_count", c_size_t),
        ("trainers", POINTER(TrainerStatus)),
        ("buckets", c_uint32),
        ("buckets_in_flight", c_uint32),
        ("current_step", c_uint64),
        ("steps_completed", c_uint64),
        ("steps_aborted", c_uint64),
        ("last_step_ns", c_uint64),
        ("median_step_ns", c_uint64),
        ("group_generation", c_uint64),
        ("groups_built", c_uint64),
        ("age_ns", c_uint64),
        ("internode_bytes", c_uint64),
        ("peer_count", c_size_t),
        ("peers", POINTER(PeerStatus)),
    ]


class Status(Structure):
    _fields_ = [
        ("daemon_version", c_char * 32),
        ("backend", c_char * 16),
        ("isa", c_char * 16),
        ("job_state", c_char * 32),
        ("job_id", c_char * 64),
        ("uptime_ns", c_uint64),
        ("settings", SessionInfo),
        ("local_size", c_uint32),
        ("world_size", c_uint32),
        ("node_rank", c_uint32),
        ("nodes", c_uint32),
        ("buckets", c_uint32),
        ("current_step", c_uint64),
        ("buckets_in_flight", c_uint32),
        ("steps_completed", c_uint64),
        ("steps_aborted", c_uint64),
        ("last_step_ns", c_uint64),
        ("median_step_ns", c_uint64),
        ("bytes_reduced", c_uint64),
        ("elements_clipped", c_uint64),
        ("nonfinite", c_uint64),
        ("trainer_count", c_size_t),
        ("trainers", POINTER(TrainerStatus)),
        ("internode_bytes", c_uint64),
        ("peer_count", c_size_t),
        ("peers", POINTER(PeerStatus)),
        ("job_hidden", c_bool),
        ("hidden_trainers", c_uint32),
        ("job_count", c_size_t),
        ("jobs", POINTER(JobStatus)),
        ("max_jobs", c_uint32),
    ]


class ConnectionStatus(Structure):
    _fields_ = [
        ("id", c_uint64),
        ("role", c_char * 16),
        ("pid", c_uint32),
        ("uid", c_uint32),
        ("gid", c_uint32),
        ("self", c_bool),
        ("local_rank", c_int32),
        ("state", c_char * 48),
        ("tensors", c_uint32),
        ("bytes", c_uint64),
        ("steps", c_uint64),
        ("hidden", c_bool),
    ]


class TraceStatus(Structure):
    _fields_ = [
        ("active", c_bool),
        ("events", c_uint64),
        ("bytes", c_uint64),
        ("dropped", c_uint64),
        ("path", c_char * 256),
        ("error", c_char * 256),
    ]


# Every struct the binding mirrors, by its C name (for the ABI test).
STRUCTS = {
    "gs_connect_options": ConnectOptions,
    "gs_launch_info": LaunchInfo,
    "gs_session_info": SessionInfo,
    "gs_tensor_spec": TensorSpec,
    "gs_cuda_tensor_spec": CudaTensorSpec,
    "gs_step_options": StepOptions,
    "gs_step_result": StepResult,
    "gs_trainer_status": TrainerStatus,
    "gs_peer_status": PeerStatus,
    "gs_job_status": JobStatus,
    "gs_status": Status,
    "gs_connection_status": ConnectionStatus,
    "gs_trace_status": TraceStatus,
    "gs_state_spec": StateSpec,
    "gs_cuda_state_spec": CudaStateSpec,
    "gs_state_result": StateResult,
}

# enum gs_dtype, enum gs_wire_dtype, enum gs_reduce_op (test_abi.py checks
# them, and that every member is here, against gradsync.h)
FLOAT32 = 1
DTYPES = {"float32": 1, "float16": 2, "bfloat16": 3, "float64": 4, "int32": 5, "int64": 6,
          "uint8": 7}
WIRE_DTYPES = {1: "fp16", 2: "bf16", 3: "fp32"}
REDUCE_OPS = {1: "average", 2: "sum"}

# ---- functions ---------------------------------------------------------------

_client_p = c_void_p
_u32_p = POINTER(c_uint32)

# name: (restype, argtypes)
_SIGNATURES = {
    "gs_version": (ctypes.c_uint, []),
    "gs_strerror": (c_char_p, [c_int]),
    "gs_err_name": (c_char_p, [c_int]),
    "gs_launch_info_get": (c_int, [POINTER(ConnectOptions), POINTER(LaunchInfo)]),
    "gs_connect": (c_int, [POINTER(ConnectOptions), POINTER(_client_p)]),
    "gs_close": (None, [_client_p]),
    "gs_last_error": (c_char_p, [_client_p]),
    "gs_session_info": (c_int, [_client_p, POINTER(SessionInfo)]),
    "gs_fd": (c_int, [_client_p]),
    "gs_register": (c_int, [_client_p, POINTER(TensorSpec), c_size_t]),
    "gs_tensor_count": (c_size_t, [_client_p]),
    "gs_bucket_count": (c_size_t, [_client_p]),
    "gs_tensor_data": (c_void_p, [_client_p, c_size_t]),
    "gs_step_begin": (c_int, [_client_p, POINTER(StepOptions)]),
    "gs_mark_ready": (c_int, [_client_p, _u32_p, c_size_t]),
    "gs_step_wait": (c_int, [_client_p, c_int, POINTER(StepResult)]),
    "gs_step_poll": (c_int, [_client_p, POINTER(StepResult)]),
    "gs_buckets_done": (c_uint32, [_client_p]),
    "gs_tensor_reduced": (c_bool, [_client_p, c_size_t]),
    "gs_mark_absent": (c_int, [_client_p, _u32_p, c_size_t]),
    "gs_tensor_produced": (c_bool, [_client_p, c_size_t]),
    "gs_reconnect": (c_int, [_client_p, c_int]),
    "gs_control_connect": (c_int, [c_char_p, c_int, POINTER(_client_p)]),
    "gs_status_get": (c_int, [_client_p, c_int, POINTER(POINTER(Status))]),
    "gs_status_free": (None, [POINTER(Status)]),
    "gs_metrics_get": (c_int, [_client_p, c_int, POINTER(c_void_p)]),
    "gs_metrics_free": (None, [c_void_p]),
    "gs_clients_get": (c_int, [_client_p, c_int, POINTER(POINTER(ConnectionStatus)),
                               POINTER(c_size_t)]),
    "gs_clients_free": (None, [POINTER(ConnectionStatus)]),
    "gs_trace_start": (c_int, [_client_p, c_int, c_int, POINTER(TraceStatus)]),
    "gs_trace_stop": (c_int, [_client_p, c_int, POINTER(TraceStatus)]),
    "gs_register_cuda": (c_int, [_client_p, POINTER(CudaTensorSpec), c_size_t]),
    "gs_cuda_mark_ready": (c_int, [_client_p, _u32_p, c_size_t, c_void_p]),
    "gs_cuda_mark_absent": (c_int, [_client_p, _u32_p, c_size_t, c_void_p]),
    "gs_cuda_stream_wait": (c_int, [_client_p, c_void_p]),
    "gs_register_state": (c_int, [_client_p, POINTER(StateSpec), c_size_t]),
    "gs_register_state_cuda": (c_int, [_client_p, POINTER(CudaStateSpec), c_size_t]),
    "gs_state_count": (c_size_t, [_client_p]),
    "gs_state_data": (c_void_p, [_client_p, c_size_t]),
    "gs_state_broadcast": (c_int, [_client_p, c_uint32, c_int]),
    "gs_state_broadcast_tensors": (c_int, [_client_p, c_uint32, _u32_p, c_size_t, c_int,
                                           POINTER(StateResult)]),
}

_lib = None


def _candidates():
    """Where libgradsync may be: $GRADSYNC_LIBRARY first (a path), then the
    dynamic linker's search (an installed library), then the linker's
    name lookup."""
    env = os.environ.get("GRADSYNC_LIBRARY")
    if env:
        return [env]
    names = ["libgradsync.so.0"]
    found = ctypes.util.find_library("gradsync")
    if found:
        names.append(found)
    return names


def lib():
    """The loaded library, with every function's signature set."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for name in _candidates():
        try:
            handle = ctypes.CDLL(name)
            break
        except OSError as e:
            tried.append(f"{name}: {e}")
    else:
        raise ImportError("cannot load libgradsync (" + "; ".join(tried) + "); install "
                          "gradsync or set GRADSYNC_LIBRARY to the library's path")
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(handle, name)
        fn.restype = restype
        fn.argtypes = argtypes
    _lib = handle
    return _lib


def text(raw: Optional[bytes]) -> str:
    """A C string (bytes or None) as str."""
    return raw.decode("utf-8", "replace") if raw else ""
