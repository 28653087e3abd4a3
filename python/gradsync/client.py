"""A trainer's connection to gradsyncd.

    with gradsync.Client() as client:    # the job from the environment
        grads = client.register([("fc.weight", 4096), ("fc.bias", 64)])
        with client.step() as step:
            grads[0][:] = ...            # write a gradient ...
            step.mark_ready([0])         # ... and say it is ready
            grads[1][:] = ...
            step.mark_ready([1])
        print(step.result.nonfinite)     # the reduced values are in grads

Tensors registered without a buffer of the caller's live in shared memory
the library maps (a sealed memfd the daemon maps too); register() returns
a NumPy float32 array over each (a memoryview when NumPy is not
installed). close() ends the session with gradsyncd at once, which frees
the trainer's local rank; the arrays keep the memory mapped, and the
library handle is freed when no array of it is left.
"""
from __future__ import annotations

import ctypes
import numbers
import operator
import socket
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from . import _lib
from .errors import (EABORTED, EAGAIN, EINVAL, ESTATE, GradSyncError, InvalidArgumentError,
                     StateError, StepAborted, error_for)

_np: Any
try:  # NumPy is optional: without it tensors are memoryviews
    import numpy
    _np = numpy
except ImportError:  # pragma: no cover - exercised where NumPy is absent
    _np = None

# A trainer's hello is answered once every node of its job has joined,
# which gradsyncd bounds by its --join-timeout (300 s by default).
DEFAULT_TIMEOUT = 600.0


@dataclass(frozen=True)
class SessionInfo:
    """What the daemon said at connection: the job's shape and settings,
    and this trainer's place in it (``local_rank`` is the one it said)."""

    world_size: int
    local_size: int
    node_rank: int
    nodes: int
    global_rank: int
    local_rank: int
    backend: str
    daemon_version: str
    threshold: int
    wire_dtype: str
    op: str
    predivide_factor: float
    fusion_buffer_elements: int

    @classmethod
    def _from_c(cls, c: _lib.SessionInfo) -> "SessionInfo":
        return cls(world_size=c.world_size, local_size=c.local_size,
                   node_rank=c.node_rank, nodes=c.nodes, global_rank=c.global_rank,
                   local_rank=c.local_rank,
                   backend=_lib.text(c.backend), daemon_version=_lib.text(c.daemon_version),
                   threshold=c.threshold,
                   wire_dtype=_lib.WIRE_DTYPES.get(c.wire_dtype, str(c.wire_dtype)),
                   op=_lib.REDUCE_OPS.get(c.op, str(c.op)),
                   predivide_factor=c.predivide_factor,
                   fusion_buffer_elements=c.fusion_buffer_elements)


@dataclass(frozen=True)
class LaunchInfo:
    """What a trainer started here would say its job is, and where each
    field came from ("GRADSYNC_LOCAL_SIZE", "LOCAL_RANK (torchrun)",
    "gs_connect_options", "default"; a setting no source gives is None,
    from "unset"): ``gradsync.launch_info()``, gradsyncctl launch-env's
    dry run, to debug a launch script."""

    job_id: str
    job_id_source: str
    local_rank: int
    local_rank_source: str
    local_size: int
    local_size_source: str
    nodes: int
    nodes_source: str
    node_rank: int
    node_rank_source: str
    coordinator: str
    coordinator_source: str
    threshold: Optional[int]
    threshold_source: str
    wire: Optional[str]
    wire_source: str
    op: Optional[str]
    op_source: str
    predivide: Union[float, str, None]  # "world", a factor, or None
    predivide_source: str
    fusion_buffer: Optional[int]
    fusion_buffer_source: str

    @classmethod
    def _from_c(cls, c: _lib.LaunchInfo) -> "LaunchInfo":
        def unset(source: bytes) -> bool:
            return _lib.text(source) == "unset"
        predivide: Union[float, str, None] = None
        if not unset(c.predivide_source):
            predivide = "world" if c.predivide_factor == 0 else c.predivide_factor
        return cls(
            job_id=_lib.text(c.job_id), job_id_source=_lib.text(c.job_id_source),
            local_rank=c.local_rank, local_rank_source=_lib.text(c.local_rank_source),
            local_size=c.local_size, local_size_source=_lib.text(c.local_size_source),
            nodes=c.nodes, nodes_source=_lib.text(c.nodes_source),
            node_rank=c.node_rank, node_rank_source=_lib.text(c.node_rank_source),
            coordinator=_lib.text(c.coordinator),
            coordinator_source=_lib.text(c.coordinator_source),
            threshold=None if unset(c.threshold_source) else c.threshold,
            threshold_source=_lib.text(c.threshold_source),
            wire=None if unset(c.wire_dtype_source) else _lib.WIRE_DTYPES.get(c.wire_dtype),
            wire_source=_lib.text(c.wire_dtype_source),
            op=None if unset(c.op_source) else _lib.REDUCE_OPS.get(c.op),
            op_source=_lib.text(c.op_source),
            predivide=predivide, predivide_source=_lib.text(c.predivide_source),
            fusion_buffer=None if unset(c.fusion_buffer_source) else c.fusion_buffer_elements,
            fusion_buffer_source=_lib.text(c.fusion_buffer_source))


@dataclass(frozen=True)
class StepResult:
    """One finished step's figures. ``nonfinite`` counts inf/NaN values in
    the reduced result (a loss scaler skips the step when it is not 0);
    ``clipped`` counts this trainer's elements that clipping changed.
    ``grad_norm`` is the L2 norm of the reduced gradients as the tensors
    now hold them, computed by gradsyncd while it unpacked them: the
    squares of the fp32 values summed in fp64 in a fixed order, the same
    on every trainer and node; inf or NaN where a value is."""

    step: int
    aborted: bool
    buckets: int
    wire_bytes: int
    clipped: int
    nonfinite: int
    duration_s: float
    grad_norm: float

    @classmethod
    def _from_c(cls, c: _lib.StepResult) -> "StepResult":
        return cls(step=c.step, aborted=c.status != 0, buckets=c.buckets,
                   wire_bytes=c.wire_bytes, clipped=c.clipped, nonfinite=c.nonfinite,
                   duration_s=c.duration_ns / 1e9, grad_norm=c.grad_norm)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to register: ``count`` float32 elements. With ``memfd``
    (a sealed memfd of the caller's, at least offset + 4 * count bytes)
    the daemon uses that memory; without, the library allocates it."""

    name: str
    count: int
    memfd: Optional[int] = None
    offset: int = 0


SpecLike = Union[TensorSpec, Tuple[str, int]]


@dataclass(frozen=True)
class StateSpec:
    """A tensor of a trainer's state: ``nbytes`` raw bytes of ``dtype``
    ("float32", "float16", "bfloat16", "float64", "int32", "int64",
    "uint8"), which gradsyncd never converts and only checks to be the same
    on every trainer. With ``memfd`` (a sealed memfd of the caller's) the
    daemon uses that memory; without, the library allocates it."""

    name: str
    nbytes: int
    dtype: str = "uint8"
    memfd: Optional[int] = None
    offset: int = 0


StateSpecLike = Union[StateSpec, Tuple[str, int, str]]


@dataclass(frozen=True)
class StateResult:
    """What a state broadcast did: the bytes of state it copied into each
    trainer, the time from the last trainer's call to the last byte, and
    the tensors that hold the source's bytes (all of those asked)."""

    nbytes: int
    duration_s: float
    tensors_done: int


def _index_array(indices: Iterable[int]) -> Any:
    """Tensor indices as the uint32_t array the library takes."""
    idx = list(indices)
    return (ctypes.c_uint32 * len(idx))(*idx)


def _timeout_ms(timeout: Optional[float]) -> int:
    return -1 if timeout is None else max(0, int(timeout * 1000))


class _Handle:
    """Owns the C handle; closed when the client and every array over its
    memory are gone (the arrays reference this object)."""

    def __init__(self, ptr: ctypes.c_void_p):
        self.ptr = ptr
        self.views = 0        # live buffers over the tensors' memory
        self.closing = False  # the owner asked to close

    def add_view(self, buf: Any) -> None:
        self.views += 1
        weakref.finalize(buf, self._view_gone)

    def _view_gone(self) -> None:
        self.views -= 1
        if self.closing and not self.views:
            self.close()

    def request_close(self) -> None:
        self.closing = True
        if not self.views:
            self.close()
        else:
            self._hang_up()

    def _hang_up(self) -> None:
        """Ends the session with gradsyncd now, although arrays keep the
        memory mapped: the daemon sees the trainer leave and frees its
        place (a model whose gradients outlive ``close()`` must not hold
        its local rank). The descriptor itself stays open until
        ``gs_close``, so that no other file can take its number first."""
        fd = _lib.lib().gs_fd(self.ptr) if self.ptr else -1
        if fd < 0:
            return
        try:
            with socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM) as dup:
                dup.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the daemon is gone already

    def close(self) -> None:
        if self.ptr:
            _lib.lib().gs_close(self.ptr)
            self.ptr = ctypes.c_void_p()

    def __del__(self) -> None:
        self.close()


class _Connection:
    """What trainer and control connections share: the handle, errors and
    closing."""

    _handle: Optional[_Handle] = None

    def _live(self) -> _Handle:
        if self._handle is None or not self._handle.ptr:
            raise StateError(ESTATE, "the connection is closed", type(self).__name__)
        return self._handle

    def _ptr(self) -> ctypes.c_void_p:
        return self._live().ptr

    def _check(self, rc: int, call: str) -> None:
        if rc < 0:
            raise self._error(rc, call)

    def _error(self, rc: int, call: str) -> GradSyncError:
        ptr = self._handle.ptr if self._handle is not None else None
        return error_for(rc, _lib.text(_lib.lib().gs_last_error(ptr)), call)

    def close(self) -> None:
        """Closes the connection (see the module's note on arrays)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.request_close()  # now, or when the last array goes

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connect_error(rc: int, call: str) -> GradSyncError:
    return error_for(rc, _lib.text(_lib.lib().gs_last_error(None)), call)


def _number(name: str, value: Optional[int], unset: int) -> int:
    """A number option for the C struct: None is ``unset`` (GS_FROM_ENV:
    left to the environment). The library checks the range; here only what
    the C field cannot hold, or would read as unset, is refused."""
    if value is None:
        return unset
    try:
        n = -1 if isinstance(value, bool) else operator.index(value)  # NumPy's ints too
    except TypeError:
        n = -1
    if not 0 <= n < unset:
        raise InvalidArgumentError(EINVAL, f"{name} is {value!r}: expected a whole number "
                                   f"from 0 to {unset - 1}, or None for the environment's",
                                   "connect")
    return n


def _choice(name: str, value: Optional[str], names: Dict[int, str]) -> int:
    """A wire dtype or op by name (``_lib``'s table of the C enum); None is
    0, the environment's."""
    if value is None:
        return 0
    for code, text in names.items():
        if value == text:
            return code
    raise InvalidArgumentError(EINVAL, f"{name} is {value!r}: expected "
                               + ", ".join(names.values()) + ", or None for the "
                               "environment's", "connect")


def _predivide(value: Union[float, str, None]) -> float:
    """"world" is 0 in the C struct, None < 0 (the environment's)."""
    if value is None:
        return -1.0
    if value == "world":
        return 0.0
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and value >= 0:
        return float(value)
    raise InvalidArgumentError(EINVAL, f"predivide is {value!r}: expected 'world', a "
                               "number, or None for the environment's", "connect")


def _fusion_buffer(value: Optional[int]) -> int:
    """Elements, where 0 in the C struct means the environment's."""
    if value is None:
        return 0
    if value == 0:
        raise InvalidArgumentError(EINVAL, "fusion_buffer is 0: expected a number of "
                                   "elements, or None for the environment's", "connect")
    return _number("fusion_buffer", value, _lib.FROM_ENV_U64)


def _connect_options(socket_path: Optional[str], local_rank: Optional[int],
                     job_id: Optional[str], timeout: Optional[float],
                     local_size: Optional[int], nodes: Optional[int],
                     node_rank: Optional[int], coordinator: Optional[str],
                     threshold: Optional[int], wire: Optional[str], op: Optional[str],
                     predivide: Union[float, str, None],
                     fusion_buffer: Optional[int]) -> _lib.ConnectOptions:
    """gs_connect_options: what is given, and GS_FROM_ENV (or its kind of
    unset) for what is left to the environment."""
    u32 = _lib.FROM_ENV
    return _lib.ConnectOptions(
        size=ctypes.sizeof(_lib.ConnectOptions), socket_path=_str(socket_path or None),
        local_rank=_number("local_rank", local_rank, u32), job_id=_str(job_id),
        timeout_ms=_timeout_ms(timeout),
        local_size=_number("local_size", local_size, u32),
        nodes=_number("nodes", nodes, u32), node_rank=_number("node_rank", node_rank, u32),
        coordinator=_str(coordinator),
        threshold=_number("threshold", threshold, _lib.FROM_ENV_U64),
        wire_dtype=_choice("wire", wire, _lib.WIRE_DTYPES),
        op=_choice("op", op, _lib.REDUCE_OPS), predivide_factor=_predivide(predivide),
        fusion_buffer_elements=_fusion_buffer(fusion_buffer))


def launch_info(local_rank: Optional[int] = None, job_id: Optional[str] = None, *,
                local_size: Optional[int] = None, nodes: Optional[int] = None,
                node_rank: Optional[int] = None, coordinator: Optional[str] = None,
                threshold: Optional[int] = None, wire: Optional[str] = None,
                op: Optional[str] = None, predivide: Union[float, str, None] = None,
                fusion_buffer: Optional[int] = None) -> LaunchInfo:
    """The job a ``Client`` made here with these arguments would say it is
    in, each field with its source, connecting to nothing (libgradsync's
    gs_launch_info_get). A bad value, given or derived, raises
    InvalidArgumentError naming the field, the variable and its value."""
    lib = _lib.lib()
    opts = _connect_options(None, local_rank, job_id, None, local_size, nodes, node_rank,
                            coordinator, threshold, wire, op, predivide, fusion_buffer)
    out = _lib.LaunchInfo()
    out.size = ctypes.sizeof(_lib.LaunchInfo)
    rc = lib.gs_launch_info_get(ctypes.byref(opts), ctypes.byref(out))
    if rc < 0:
        raise _connect_error(rc, "launch_info")
    return LaunchInfo._from_c(out)


def _str(value: Optional[str]) -> Optional[bytes]:
    return value.encode() if value is not None else None


class Client(_Connection):
    """A trainer's connection to gradsyncd on ``socket_path``
    ($GRADSYNC_SOCKET, else the default /run/gradsync/gradsyncd.sock).
    Not thread-safe beyond one call at a time, which an internal lock
    enforces.

    The job's fields (``job_id``, ``local_rank`` 0..local_size-1 of the
    node, ``local_size``, ``nodes``, ``node_rank``, ``coordinator``: the
    host of node 0) and its settings (``threshold`` in elements, ``wire``
    "fp16", "bf16" or "fp32", ``op`` "average" or "sum", ``predivide``
    "world" or a factor, ``fusion_buffer`` in elements) are what this
    trainer says its job is. Each one left at None is derived by
    libgradsync from the environment, field by field: GRADSYNC_* (e.g.
    $GRADSYNC_LOCAL_RANK, $GRADSYNC_THRESHOLD), then torchrun's
    ($TORCHELASTIC_RUN_ID, $LOCAL_RANK, $LOCAL_WORLD_SIZE,
    $WORLD_SIZE / $LOCAL_WORLD_SIZE, $GROUP_RANK, $MASTER_ADDR), then
    Slurm's ($SLURM_JOB_ID.$SLURM_STEP_ID, $SLURM_LOCALID,
    $SLURM_NTASKS_PER_NODE or $SLURM_TASKS_PER_NODE, $SLURM_NNODES,
    $SLURM_NODEID, $MASTER_ADDR),
    else the library's default (job id "", local rank 0, sizes 1, node
    rank 0; a setting no source gives is the job's, unchecked). A value
    given here is sent as the job's and checked by gradsyncd, which refuses
    a trainer whose view differs from its job's (RefusedError naming the
    field and both values). A bad value, given or derived, raises
    InvalidArgumentError naming the field and its source. ``timeout``
    (seconds, None: no limit) bounds the connection and the hello, whose
    answer comes once every node of the job has joined."""

    def __init__(self, socket_path: Optional[str] = None, local_rank: Optional[int] = None,
                 job_id: Optional[str] = None, timeout: Optional[float] = DEFAULT_TIMEOUT, *,
                 local_size: Optional[int] = None, nodes: Optional[int] = None,
                 node_rank: Optional[int] = None, coordinator: Optional[str] = None,
                 threshold: Optional[int] = None, wire: Optional[str] = None,
                 op: Optional[str] = None, predivide: Union[float, str, None] = None,
                 fusion_buffer: Optional[int] = None):
        lib = _lib.lib()
        opts = _connect_options(socket_path, local_rank, job_id, timeout, local_size, nodes,
                                node_rank, coordinator, threshold, wire, op, predivide,
                                fusion_buffer)
        ptr = ctypes.c_void_p()
        rc = lib.gs_connect(ctypes.byref(opts), ctypes.byref(ptr))
        if rc < 0:
            raise _connect_error(rc, "connect")
        self._handle = _Handle(ptr)
        self._lock = threading.Lock()
        self._counts: List[int] = []
        self._cuda = False
        self._cuda_state = False
        c_info = _lib.SessionInfo()
        self._check(lib.gs_session_info(ptr, ctypes.byref(c_info)), "session_info")
        self.info = SessionInfo._from_c(c_info)

    # ---- the trainer's place in its job ----------------------------------
    # What gradsyncd said in its welcome, for what a process group would
    # otherwise give: DistributedSampler(ds, num_replicas=c.world_size,
    # rank=c.rank), logging from rank 0 only.

    @property
    def rank(self) -> int:
        """This trainer's global rank, 0..world_size-1 (torch.distributed's
        get_rank())."""
        return self.info.global_rank

    @property
    def world_size(self) -> int:
        """The job's trainers on all its nodes."""
        return self.info.world_size

    @property
    def local_rank(self) -> int:
        """This trainer's rank on its node, 0..local_size-1."""
        return self.info.local_rank

    @property
    def local_size(self) -> int:
        """The job's trainers on this node."""
        return self.info.local_size

    @property
    def node_rank(self) -> int:
        """This node's rank in the job, 0..nodes-1."""
        return self.info.node_rank

    @property
    def nodes(self) -> int:
        """The job's nodes."""
        return self.info.nodes

    # ---- registration ----------------------------------------------------

    def register(self, specs: Iterable[SpecLike]) -> List[Any]:
        """Registers tensors in backpropagation order, once per connection;
        returns one float32 array (or memoryview) per tensor over the memory
        the daemon reads and writes back."""
        tensors = [s if isinstance(s, TensorSpec) else TensorSpec(s[0], s[1]) for s in specs]
        names = [t.name.encode() for t in tensors]  # kept alive for the call
        arr = (_lib.TensorSpec * len(tensors))()
        for c, s, name in zip(arr, tensors, names):
            c.name, c.count, c.dtype = name, s.count, _lib.FLOAT32
            c.memfd = -1 if s.memfd is None else s.memfd
            c.offset = s.offset
        with self._lock:
            self._check(_lib.lib().gs_register(self._ptr(), arr, len(tensors)), "register")
        self._counts = [t.count for t in tensors]
        return [self.tensor(i) for i in range(len(tensors))]

    def register_cuda(self, tensors: Sequence[Tuple[str, int, int]]) -> None:
        """Registers CUDA tensors given as (name, element count, device
        pointer) of float32 memory on this local rank's GPU; needs the
        daemon's cuda backend."""
        names = [t[0].encode() for t in tensors]
        arr = (_lib.CudaTensorSpec * len(tensors))()
        for c, (_, count, ptr), name in zip(arr, tensors, names):
            c.name, c.count, c.dtype, c.data = name, count, _lib.FLOAT32, ptr
        with self._lock:
            self._check(_lib.lib().gs_register_cuda(self._ptr(), arr, len(tensors)),
                        "register_cuda")
        self._counts = [t[1] for t in tensors]
        self._cuda = True

    @property
    def tensor_count(self) -> int:
        return _lib.lib().gs_tensor_count(self._ptr())

    @property
    def bucket_count(self) -> int:
        """Buckets of the daemon's fusion plan for the registered tensors."""
        return _lib.lib().gs_bucket_count(self._ptr())

    def tensor(self, index: int) -> Any:
        """Registered tensor ``index`` as a float32 array over its shared
        memory (host backend); raises IndexError when out of range."""
        if self._cuda:
            raise StateError(ESTATE, "CUDA tensors stay in GPU memory: use the caller's "
                             "own tensors", "tensor")
        if not 0 <= index < len(self._counts):
            raise IndexError(f"no registered tensor {index} (of {len(self._counts)})")
        addr = _lib.lib().gs_tensor_data(self._ptr(), index)
        buf = (ctypes.c_float * self._counts[index]).from_address(addr)
        self._live().add_view(buf)  # no view outlives the mapping
        if _np is not None:
            return _np.frombuffer(buf, dtype=_np.float32)
        return memoryview(buf).cast("B").cast("f")

    # ---- state ---------------------------------------------------------------

    def register_state(self, specs: Iterable[StateSpecLike]) -> List[Any]:
        """Registers this trainer's state (parameters and buffers, any
        dtype), once per connection, beside its gradients or without them;
        every trainer of the job registers the same names, sizes and dtypes
        in the same order. Returns one uint8 array (or memoryview) per
        tensor over the memory gradsyncd shares, for the caller to fill."""
        tensors = [s if isinstance(s, StateSpec) else StateSpec(*s) for s in specs]
        names = [t.name.encode() for t in tensors]  # kept alive for the call
        arr = (_lib.StateSpec * len(tensors))()
        for c, s, name in zip(arr, tensors, names):
            if s.dtype not in _lib.DTYPES:
                raise InvalidArgumentError(EINVAL, f"state tensor {s.name}: dtype {s.dtype!r} "
                                           "is none of " + ", ".join(_lib.DTYPES),
                                           "register_state")
            c.name, c.bytes, c.dtype = name, s.nbytes, _lib.DTYPES[s.dtype]
            c.memfd = -1 if s.memfd is None else s.memfd
            c.offset = s.offset
        with self._lock:
            self._check(_lib.lib().gs_register_state(self._ptr(), arr, len(tensors)),
                        "register_state")
        self._state_bytes = [t.nbytes for t in tensors]
        return [self.state(i) for i in range(len(tensors))]

    def register_state_cuda(self, tensors: Sequence[Tuple[str, int, str, int]]) -> None:
        """Registers this trainer's state in CUDA memory (gradsyncd's cuda
        backend), once per connection: (name, bytes, dtype, device pointer)
        per tensor, all on this local rank's GPU, dtype as register_state's.
        gradsyncd opens the allocations' CUDA IPC handles; the memory stays
        the caller's (PyTorch: contiguous tensors' data_ptr(), kept alive).
        The caller's GPU work on it must be complete (its stream
        synchronised) before broadcast_state, which returns once it holds
        the source's bytes (copied device to device)."""
        names = [t[0].encode() for t in tensors]  # kept alive for the call
        arr = (_lib.CudaStateSpec * len(tensors))()
        for c, (name, nbytes, dtype, ptr), bname in zip(arr, tensors, names):
            if dtype not in _lib.DTYPES:
                raise InvalidArgumentError(EINVAL, f"state tensor {name}: dtype {dtype!r} "
                                           "is none of " + ", ".join(_lib.DTYPES),
                                           "register_state_cuda")
            c.name, c.bytes, c.dtype, c.data = bname, nbytes, _lib.DTYPES[dtype], ptr
        with self._lock:
            self._check(_lib.lib().gs_register_state_cuda(self._ptr(), arr, len(tensors)),
                        "register_state_cuda")
        self._state_bytes = [t[1] for t in tensors]
        self._cuda_state = True

    @property
    def state_count(self) -> int:
        return _lib.lib().gs_state_count(self._ptr())

    def state(self, index: int) -> Any:
        """Registered state tensor ``index`` as a uint8 array over its
        shared memory; raises IndexError when out of range."""
        sizes = getattr(self, "_state_bytes", [])
        if self._cuda_state:
            raise StateError(ESTATE, "CUDA state stays in GPU memory: use the caller's "
                             "own tensors", "state")
        if not 0 <= index < len(sizes):
            raise IndexError(f"no registered state tensor {index} (of {len(sizes)})")
        addr = _lib.lib().gs_state_data(self._ptr(), index)
        buf = (ctypes.c_uint8 * sizes[index]).from_address(addr)
        self._live().add_view(buf)  # no view outlives the mapping
        if _np is not None:
            return _np.frombuffer(buf, dtype=_np.uint8)
        return memoryview(buf).cast("B")

    def broadcast_state(self, source: int = 0, tensors: Optional[Iterable[int]] = None,
                        timeout: Optional[float] = DEFAULT_TIMEOUT) -> StateResult:
        """Makes every trainer's registered state (or the state tensors at
        the indices ``tensors``) bit for bit equal to that of the trainer of
        global rank ``source``, as DDP's broadcast at wrap. A collective:
        every trainer of the job calls it between steps with the same
        arguments, on one node or several. On an error (GradSyncError
        naming what failed) before the copy began nothing was copied and
        each trainer keeps its own state; a node lost during the copy
        between nodes may leave a tensor partly the source's (README, "A
        trainer's state"): broadcast again."""
        idx = sorted(set(tensors)) if tensors is not None else []
        arr = _index_array(idx)
        out = _lib.StateResult(ctypes.sizeof(_lib.StateResult))
        with self._lock:
            rc = _lib.lib().gs_state_broadcast_tensors(self._ptr(), source, arr, len(idx),
                                                      _timeout_ms(timeout), ctypes.byref(out))
            self._check(rc, "broadcast_state")
        return StateResult(out.bytes, out.duration_ns / 1e9, out.tensors_done)

    # ---- steps -----------------------------------------------------------

    def begin_step(self, clip_value: Optional[float] = None,
                   bucket_events: bool = False) -> None:
        """Starts the next step; ``clip_value`` clips every element of this
        trainer's gradients to [-clip_value, clip_value] before reduction."""
        opts = _lib.StepOptions(ctypes.sizeof(_lib.StepOptions), clip_value is not None,
                                100.0 if clip_value is None else float(clip_value),
                                bucket_events)
        with self._lock:
            self._check(_lib.lib().gs_step_begin(self._ptr(), ctypes.byref(opts)),
                        "begin_step")

    def mark_ready(self, indices: Iterable[int]) -> None:
        """Marks registered tensors ready (one message for all of them)."""
        arr = _index_array(indices)
        with self._lock:
            self._check(_lib.lib().gs_mark_ready(self._ptr(), arr, len(arr)), "mark_ready")

    def mark_absent(self, indices: Iterable[int]) -> None:
        """Marks registered tensors that this trainer produced no gradient
        for this step: they take part with what their memory holds (write
        zeros first unless this trainer adds a gradient of its own), and
        one that no trainer of the job produced is left as each trainer
        has it (``tensor_produced`` then says False)."""
        arr = _index_array(indices)
        with self._lock:
            self._check(_lib.lib().gs_mark_absent(self._ptr(), arr, len(arr)), "mark_absent")

    def cuda_mark_ready(self, indices: Iterable[int], stream: int = 0) -> None:
        """mark_ready for CUDA tensors: the daemon's GPU waits for the work
        queued on ``stream`` (a cudaStream_t as an int) so far."""
        arr = _index_array(indices)
        with self._lock:
            self._check(_lib.lib().gs_cuda_mark_ready(self._ptr(), arr, len(arr),
                                                      stream or None), "cuda_mark_ready")

    def cuda_mark_absent(self, indices: Iterable[int], stream: int = 0) -> None:
        """mark_absent for CUDA tensors: the daemon's GPU waits for the
        work queued on ``stream`` so far (the zeroing) before reading."""
        arr = _index_array(indices)
        with self._lock:
            self._check(_lib.lib().gs_cuda_mark_absent(self._ptr(), arr, len(arr),
                                                       stream or None), "cuda_mark_absent")

    def cuda_stream_wait(self, stream: int = 0) -> None:
        """Makes ``stream`` wait on the GPU for the reported results."""
        with self._lock:
            self._check(_lib.lib().gs_cuda_stream_wait(self._ptr(), stream or None),
                        "cuda_stream_wait")

    def wait(self, timeout: Optional[float] = None) -> StepResult:
        """Waits for the step to finish (``timeout`` seconds, None: no
        limit). Raises StepAborted, with ``result``, when it was aborted."""
        out = _lib.StepResult()
        with self._lock:
            rc = _lib.lib().gs_step_wait(self._ptr(), _timeout_ms(timeout), ctypes.byref(out))
        return self._finish(rc, out, "wait")

    def poll(self) -> Optional[StepResult]:
        """The step's result if it has finished, else None; never blocks."""
        out = _lib.StepResult()
        with self._lock:
            rc = _lib.lib().gs_step_poll(self._ptr(), ctypes.byref(out))
        if rc == EAGAIN:
            return None
        return self._finish(rc, out, "poll")

    def _finish(self, rc: int, out: _lib.StepResult, call: str) -> StepResult:
        if rc == EABORTED:
            err = self._error(rc, call)
            if isinstance(err, StepAborted):
                err.result = StepResult._from_c(out)
            raise err
        self._check(rc, call)
        return StepResult._from_c(out)

    def step(self, clip_value: Optional[float] = None, timeout: Optional[float] = None,
             bucket_events: bool = False) -> "Step":
        """A context manager: begins a step, and waits for it on leaving the
        block (unless the block raised)."""
        return Step(self, clip_value, timeout, bucket_events)

    @property
    def buckets_done(self) -> int:
        """Buckets of this step reported done (with bucket_events=True)."""
        return _lib.lib().gs_buckets_done(self._ptr())

    def tensor_reduced(self, index: int) -> bool:
        """After a step: whether tensor ``index`` holds the reduced result
        (False: it still holds this trainer's own gradient)."""
        return bool(_lib.lib().gs_tensor_reduced(self._ptr(), index))

    def tensor_produced(self, index: int) -> bool:
        """After a step: whether some trainer of the job produced tensor
        ``index``'s gradient (False: every trainer marked it absent, and
        its memory is as this trainer left it)."""
        return bool(_lib.lib().gs_tensor_produced(self._ptr(), index))

    def reconnect(self, timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        """After DisconnectedError: connects to the daemon again and
        registers the same tensors (same memory) again."""
        with self._lock:
            self._check(_lib.lib().gs_reconnect(self._ptr(), _timeout_ms(timeout)),
                        "reconnect")

    def fileno(self) -> int:
        """The socket, for select/poll/asyncio: readable when poll() may
        have news."""
        return _lib.lib().gs_fd(self._ptr())


class Step:
    """See Client.step()."""

    def __init__(self, client: Client, clip_value: Optional[float],
                 timeout: Optional[float], bucket_events: bool):
        self.client = client
        self.clip_value = clip_value
        self.timeout = timeout
        self.bucket_events = bucket_events
        self.result: Optional[StepResult] = None

    def mark_ready(self, indices: Iterable[int]) -> None:
        self.client.mark_ready(indices)

    def mark_absent(self, indices: Iterable[int]) -> None:
        self.client.mark_absent(indices)

    def __enter__(self) -> "Step":
        self.client.begin_step(self.clip_value, self.bucket_events)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.result = self.client.wait(self.timeout)
