"""PyTorch integration: gradsyncd synchronises a model's gradients.

Three lines turn a single-process training loop into data-parallel
training (one process per GPU, or per CPU trainer, on each node):

    import gradsync.torch
    sync = gradsync.torch.GradSync(model, optimizer=optimizer)
    # ... loss.backward(); optimizer.step() as before

GradSync registers every parameter's gradient with the daemon once, in
backpropagation order (the reverse of ``model.parameters()``). During
``backward()`` a post-accumulate-grad hook marks each gradient ready as
soon as autograd has produced it, so the daemon reduces early buckets
while backpropagation goes on. As in DDP, ``backward()`` returns once the
reduced gradients are in ``param.grad``: the first hook of each backward
pass queues a callback that autograd runs when the pass ends, and that
waits for the step. Whatever reads the gradients between ``backward()``
and ``optimizer.step()`` (``clip_grad_norm_``, a ``GradScaler``'s unscale
and inf check) sees the average. ``wait()`` then returns that step's
result without another all-reduce, and so does the optimizer's step
pre-hook when ``optimizer`` is given.

CPU gradients live in memory shared with the daemon: each ``param.grad``
is a view of it, so the daemon reads and writes the gradient in place.
CUDA gradients stay in GPU memory the daemon maps through CUDA IPC; the
trainer's stream and the daemon's wait on each other on the GPU.

Under torchrun or srun nothing else need be given: libgradsync derives the
job (its id, this trainer's local rank, the node's trainers, the nodes,
this node's rank, node 0's host) and its settings from the launcher's
environment, as ``GradSync`` says.

``last_result.nonfinite`` (inf/NaN values in the reduced gradients) lets a
mixed-precision loss scaler skip a step, and ``last_result.grad_norm`` is
the reduced gradients' global L2 norm, which ``GradSync.clip_grad_norm_``
clips by without computing it again.

As DDP does, wrapping a model makes every replica start equal: GradSync
registers the model's state (every parameter, frozen ones too, and every
buffer) with the daemon, moving each tensor's storage into memory shared
with it, and broadcasts it from global rank 0, bit for bit. With
``broadcast_buffers=True`` (DDP's default) a forward pre-hook broadcasts
the buffers (BatchNorm's running statistics) from rank 0 before each
forward in training mode, every rank doing the same forwards.

``rank``, ``world_size``, ``local_rank``, ``local_size``, ``node_rank`` and
``nodes`` say where the trainer sits in its job, as gradsyncd said at
connection, for what would otherwise need a process group:
``DistributedSampler(dataset, num_replicas=sync.world_size, rank=sync.rank)``.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterable, Iterator, List, Optional, Set, Tuple, Union

import torch

from .client import Client, StepResult
from .errors import (EDTYPE, EINVAL, ESTATE, DtypeError, InvalidArgumentError, StateError,
                     StepAborted)

Params = Union[torch.nn.Module, Iterable[torch.nn.Parameter]]

# Where GradSync's current step stands.
_IDLE = "idle"        # none open or reduced: none yet, the last failed, or no_sync() moved on
_OPEN = "open"        # begun: gradients are being marked ready
_REDUCED = "reduced"  # waited for: param.grad holds it, last_result says how it went


def _named_parameters(model: Params) -> List[tuple]:
    """(name, parameter) pairs that need gradients, each parameter once."""
    if isinstance(model, torch.nn.Module):
        pairs = list(model.named_parameters())
    else:
        pairs = [(f"param{i}", p) for i, p in enumerate(model)]
    seen, out = set(), []
    for name, p in pairs:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


# The dtypes gradsyncd names; any other travels as its raw bytes ("uint8").
_STATE_DTYPES = {torch.float32: "float32", torch.float16: "float16",
                 torch.bfloat16: "bfloat16", torch.float64: "float64", torch.int32: "int32",
                 torch.int64: "int64", torch.uint8: "uint8"}


def _named_state(model: Params) -> List[Tuple[str, torch.Tensor, Any, str]]:
    """The state DDP broadcasts at wrap: (name, tensor, owner, attribute)
    for every parameter, then every buffer, each once; owner is the module
    holding a buffer (None for a parameter), attribute its name there."""
    if isinstance(model, torch.nn.Module):
        params = [(n, p, None, "") for n, p in model.named_parameters()]
        buffers = [(f"{mn}.{bn}" if mn else bn, b, m, bn)
                   for mn, m in model.named_modules() for bn, b in m._buffers.items()
                   if b is not None]
    else:
        params = [(f"param{i}", p, None, "") for i, p in enumerate(model)]
        buffers = []
    seen, out = set(), []
    for entry in params + buffers:
        t = entry[1]
        if id(t) not in seen and t.numel() > 0:
            seen.add(id(t))
            out.append(entry)
    return out


class GradSync:
    """Synchronises the gradients of ``model`` (a Module or an iterable of
    parameters) through the node's gradsyncd.

    With no other argument, as under torchrun or srun, everything about
    the job comes from the environment through libgradsync (see
    ``gradsync.Client``): the job id, ``local_rank`` ($LOCAL_RANK,
    $SLURM_LOCALID), ``local_size``, ``nodes``, ``node_rank``,
    ``coordinator`` ($MASTER_ADDR), and the job's settings ``threshold``
    (elements), ``wire`` ("fp16", "bf16", "fp32"), ``op`` ("average",
    "sum"), ``predivide`` and ``fusion_buffer`` ($GRADSYNC_THRESHOLD,
    $GRADSYNC_WIRE, ...). An argument given overrides its field and is
    sent to gradsyncd as what this trainer says the job is: a job whose
    value differs refuses the trainer (RefusedError naming the field and
    both values). ``client.info`` shows what the job runs with.

    ``clip_value`` clips each element of this trainer's gradients to
    [-clip_value, clip_value] before reduction. ``backward()`` returns
    once the step's reduced gradients are in ``param.grad``, as with DDP.
    ``optimizer``: its step waits for a step that is not finished yet
    (gradients produced without ``backward()``); ``wait()`` does the same
    without it. ``socket_path`` is gradsyncd's socket ($GRADSYNC_SOCKET,
    else the default); ``timeout`` (seconds, None: no limit) bounds each
    wait for a step, that at the end of ``backward()`` included.

    ``broadcast_state`` (default True, as DDP): the model's parameters and
    buffers are broadcast from global rank 0 when it is wrapped, so that
    replicas initialised apart start equal; ``broadcast_buffers`` (default
    True, as DDP) broadcasts the buffers again before each training
    forward, on one node or several. CPU tensors move into memory shared
    with gradsyncd; CUDA tensors stay where they are, and gradsyncd's cuda
    backend opens their allocations' IPC handles (Client.register_state_cuda)
    and copies GPU to GPU; the current stream is synchronised before each
    broadcast, so that it sees the GPU's latest writes.
    """

    def __init__(self, model: Params, threshold: Optional[int] = None,
                 wire: Optional[str] = None, clip_value: Optional[float] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None,
                 socket_path: Optional[str] = None, local_rank: Optional[int] = None,
                 job_id: Optional[str] = None, timeout: Optional[float] = None, *,
                 op: Optional[str] = None, predivide: Union[float, str, None] = None,
                 fusion_buffer: Optional[int] = None, local_size: Optional[int] = None,
                 nodes: Optional[int] = None, node_rank: Optional[int] = None,
                 coordinator: Optional[str] = None, broadcast_state: bool = True,
                 broadcast_buffers: bool = True):
        self.clip_value = clip_value
        self.timeout = timeout
        self.last_result: Optional[StepResult] = None
        # Backpropagation produces the last layer's gradients first.
        named = list(reversed(_named_parameters(model)))
        if not named:
            raise InvalidArgumentError(EINVAL, "the model has no parameter that requires a "
                                       "gradient", "GradSync")
        self.params = [p for _, p in named]
        self._check_params(named)
        self.client = Client(socket_path, local_rank, job_id, local_size=local_size,
                             nodes=nodes, node_rank=node_rank, coordinator=coordinator,
                             threshold=threshold, wire=wire, op=op, predivide=predivide,
                             fusion_buffer=fusion_buffer)
        self._hooks: List[Any] = []
        try:
            self._grads = self._register(named)
            if broadcast_state and self._can_broadcast_state():
                self._share_state(model, broadcast_buffers)
        except BaseException:
            self.client.close()
            raise
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._marked = [False] * len(self.params)
        self._state = _IDLE
        self._produced_locally: Set[int] = set()  # under no_sync() since the last step
        self._clips = False  # clip_grad_norm_ was called: mark the reduced gradients
        self._reduced_marks: Optional[Tuple[list, Optional[torch.Tensor]]] = None
        # The backward passes (autograd graph tasks) whose ends wait for
        # the step: one callback per pass, queued by its first gradient.
        self._waiting_tasks: Set[int] = set()
        self._syncing = True
        self._hooks += [p.register_post_accumulate_grad_hook(self._grad_ready)
                        for p in self.params]
        if optimizer is not None:
            self._hooks.append(optimizer.register_step_pre_hook(self._before_step))

    # ---- set-up ------------------------------------------------------------

    def _check_params(self, named: List[tuple]) -> None:
        devices = {p.device for _, p in named}
        if len(devices) > 1:
            raise InvalidArgumentError(EINVAL, "parameters are on several devices ("
                                       + ", ".join(sorted(map(str, devices)))
                                       + "); one trainer drives one device", "GradSync")
        self.device = devices.pop()
        for name, p in named:
            if p.dtype != torch.float32:
                raise DtypeError(EDTYPE, f"parameter {name} is {p.dtype}: gradsync "
                                           "reduces float32 gradients (keep fp32 master "
                                           "weights)", "GradSync")

    def _register(self, named: List[tuple]) -> List[torch.Tensor]:
        if self.device.type == "cuda":
            grads = [torch.zeros_like(p, memory_format=torch.contiguous_format)
                     for _, p in named]
            self.client.register_cuda([(n, p.numel(), g.data_ptr())
                                       for (n, p), g in zip(named, grads)])
        else:
            arrays = self.client.register([(n, p.numel()) for n, p in named])
            grads = [torch.from_numpy(a).view(p.shape) for a, (_, p) in zip(arrays, named)]
        # param.grad stays as it is (None, as DDP leaves a parameter that
        # no backward has reached); the first gradient autograd makes is
        # copied into the registered memory (_bind).
        return grads

    # ---- the state, as DDP broadcasts it ------------------------------------

    def _can_broadcast_state(self) -> bool:
        if self.device.type in ("cpu", "cuda"):
            return True
        warnings.warn(f"GradSync: replicas are not broadcast from rank 0 at wrap, as its "
                      f"parameters are on {self.device}: GradSync broadcasts the state of "
                      "CPU and CUDA tensors only; start every replica equal (seed it)",
                      stacklevel=3)
        return False

    def _share_state(self, model: Params, broadcast_buffers: bool) -> None:
        """Registers every parameter and buffer as the trainer's state,
        broadcasts it from global rank 0, and with broadcast_buffers hooks
        the buffers' broadcast before each forward."""
        state = _named_state(model)
        if self.device.type == "cuda":
            self._register_state_cuda(state)
        else:
            self._register_state_shared(state)
        self._broadcast_state(None)
        self.state_names = [name for name, _, _, _ in state]
        self._buffer_indices = [i for i, (_, _, owner, _) in enumerate(state)
                                if owner is not None]
        if broadcast_buffers and self._buffer_indices and isinstance(model, torch.nn.Module):
            self._hooks.append(model.register_forward_pre_hook(self._before_forward))

    def _register_state_cuda(self, state: List[Tuple[str, torch.Tensor, Any, str]]) -> None:
        """CUDA state stays in the tensors' own memory; a non-contiguous one
        is first given contiguous memory of its own. The registered tensors
        are kept alive here: gradsyncd writes into their memory, which must
        not go back to the caching allocator while it may."""
        for k, (name, t, owner, attr) in enumerate(state):
            if t.device != self.device:
                raise InvalidArgumentError(EINVAL, f"state tensor {name} is on {t.device}, "
                                           f"the parameters on {self.device}: one trainer "
                                           "drives one device", "GradSync")
            if not t.is_contiguous():
                c = t.detach().contiguous()
                if owner is None:
                    t.data = c
                else:
                    owner._buffers[attr] = c
                state[k] = (name, c, owner, attr)
        self._state_tensors = [t for _, t, _, _ in state]
        self.client.register_state_cuda(
            [(name, t.numel() * t.element_size(), _STATE_DTYPES.get(t.dtype, "uint8"),
              t.data_ptr()) for name, t, _, _ in state])

    def _broadcast_state(self, indices: Optional[List[int]]) -> None:
        if self.device.type == "cuda":  # gradsyncd reads what the GPU last wrote
            torch.cuda.current_stream(self.device).synchronize()
        self.client.broadcast_state(0, indices)

    def _register_state_shared(self, state: List[Tuple[str, torch.Tensor, Any, str]]) -> None:
        """Moves each tensor's storage into memory shared with gradsyncd."""
        arrays = self.client.register_state(
            [(name, t.numel() * t.element_size(), _STATE_DTYPES.get(t.dtype, "uint8"))
             for name, t, _, _ in state])
        for (name, t, owner, attr), a in zip(state, arrays):
            shared = torch.from_numpy(a).view(t.dtype).view(t.shape)
            with torch.no_grad():
                shared.copy_(t)
            if owner is None:
                t.data = shared  # the Parameter object stays: optimizers hold it
            else:
                owner._buffers[attr] = shared

    def _before_forward(self, module: torch.nn.Module, args: Any) -> None:
        # Only training forwards, which every rank runs alike (a collective).
        if module.training and torch.is_grad_enabled():
            self._broadcast_state(self._buffer_indices)

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # Inside no_sync() the step takes the local gradients, as DDP's.
        if self._syncing:
            self.wait()

    # ---- the trainer's place in its job --------------------------------------

    @property
    def rank(self) -> int:
        """This trainer's global rank (``Client.rank``)."""
        return self.client.rank

    @property
    def world_size(self) -> int:
        """The job's trainers on all its nodes."""
        return self.client.world_size

    @property
    def local_rank(self) -> int:
        """This trainer's rank on its node."""
        return self.client.local_rank

    @property
    def local_size(self) -> int:
        """The job's trainers on this node."""
        return self.client.local_size

    @property
    def node_rank(self) -> int:
        """This node's rank in the job."""
        return self.client.node_rank

    @property
    def nodes(self) -> int:
        """The job's nodes."""
        return self.client.nodes

    # ---- during backward -----------------------------------------------------

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not self._syncing:
            # The gradients are no longer the reduced ones: a later wait()
            # synchronises them instead of returning the last result, and
            # counts this one as produced (accumulated here, as DDP's).
            if self._state == _REDUCED:
                self._state = _IDLE
            self._produced_locally.add(self._index[id(p)])
            return
        i = self._index[id(p)]
        if self._marked[i]:
            raise StateError(ESTATE, f"gradient {i} produced twice in one step; call wait() "
                             "before the next backward()", "GradSync")
        self._begin()
        self._wait_at_end_of_backward()
        self._bind(i)
        self._mark([i])
        self._marked[i] = True

    def _wait_at_end_of_backward(self) -> None:
        """Has autograd wait for the step when this backward pass ends, as
        DDP's reducer does: a final callback runs after the pass's last
        gradient, before backward() returns, with the caller's streams
        current."""
        task = torch._C._current_graph_task_id()
        if task in self._waiting_tasks:
            return
        self._waiting_tasks.add(task)
        torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        self._waiting_tasks.discard(torch._C._current_graph_task_id())
        outer = torch._C._current_autograd_node()
        if outer is not None:
            # A pass run inside a node of another (reentrant activation
            # checkpointing): the outer pass has gradients still to come,
            # so the wait moves to its end, queued once that node is done.
            outer.register_hook(lambda *_: self._wait_at_end_of_backward())
            return
        # Passes that failed before their end left their ids behind.
        self._waiting_tasks.clear()
        self.wait()

    def _mark(self, indices: List[int]) -> None:
        """Marks gradients ready; on a GPU, after the work queued so far on
        the current stream (the kernels that produced them)."""
        if self.device.type == "cuda":
            self.client.cuda_mark_ready(indices, self._stream())
        else:
            self.client.mark_ready(indices)

    def _mark_absent(self, indices: List[int]) -> None:
        """Marks the gradients that this backward did not produce: each
        takes part with what its memory holds (zeros, or a gradient the
        parameter already had: DDP adds that too), and one that no trainer
        of the job produced is not written back (_after_wait)."""
        for i in indices:
            p = self.params[i]
            if p.requires_grad and p.grad is not None:
                self._bind(i)
            else:
                self._grads[i].zero_()
        if self.device.type == "cuda":
            self.client.cuda_mark_absent(indices, self._stream())
        else:
            self.client.mark_absent(indices)

    def _after_wait(self, absent: List[int]) -> None:
        """A parameter whose gradient this trainer did not produce gets the
        average where another trainer produced it; where none did, its
        .grad stays as it was (None, as DDP leaves it), and a parameter
        frozen since wrapping (requires_grad False) is never given one."""
        for i in absent:
            p = self.params[i]
            if p.requires_grad and self.client.tensor_produced(i):
                p.grad = self._grads[i]

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def _begin(self) -> None:
        if self._state != _OPEN:
            self.client.begin_step(self.clip_value)
            self._state = _OPEN

    def _bind(self, i: int) -> None:
        """Puts parameter i's gradient into the registered memory: autograd
        made a new tensor when .grad was None (zero_grad(set_to_none=True))."""
        p, g = self.params[i], self._grads[i]
        if p.grad is None:
            g.zero_()
        elif p.grad.data_ptr() != g.data_ptr():
            g.copy_(p.grad)
        else:
            return
        p.grad = g

    # ---- the step ------------------------------------------------------------

    def wait(self) -> StepResult:
        """The step's result, once its reduced gradients are in each
        ``param.grad``. ``backward()`` has waited already, so this returns
        its step's result without another all-reduce, however often it is
        called, until the next ``backward()``. With gradients put in
        ``param.grad`` some other way, it synchronises them.

        A parameter that got no gradient this step takes part with zeros,
        and one that no trainer of the job got a gradient for keeps
        ``grad = None`` (as DDP with find_unused_parameters); one frozen
        after wrapping is left alone. Raises StepAborted when the
        step was aborted (``param.grad`` then holds this trainer's own
        gradient wherever it was not reduced), and TimeoutError when it did
        not end within the timeout: the step then still runs, and
        ``param.grad`` must not be read until ``self.client.wait()`` has
        returned."""
        if self._state == _REDUCED:
            assert self.last_result is not None
            return self.last_result
        if self._state == _IDLE and not any(p.grad is not None for p in self.params):
            raise StateError(ESTATE, "no gradient to synchronise: call backward() first",
                             "GradSync.wait")
        self._begin()
        unmarked = [i for i, m in enumerate(self._marked) if not m]
        # Gradients this trainer produced that no hook marked: accumulated
        # under no_sync(), or, when no backward ran at all, put in .grad by
        # the caller. They take part as produced; the rest are absent.
        by_hand = len(unmarked) == len(self.params) and not self._produced_locally
        produced = [i for i in unmarked if self.params[i].grad is not None
                    and self.params[i].requires_grad
                    and (by_hand or i in self._produced_locally)]
        absent = sorted(set(unmarked) - set(produced))
        for i in produced:
            self._bind(i)
        if produced:
            self._mark(produced)
        if absent:
            self._mark_absent(absent)
        self._marked = [False] * len(self.params)
        self._produced_locally = set()
        self._state = _IDLE  # until the step is known to have ended well
        try:
            self.last_result = self.client.wait(self.timeout)
        except StepAborted:
            self._follow_daemon()
            raise
        self._follow_daemon()
        self._after_wait(absent)
        self._state = _REDUCED
        if self._clips:
            self._reduced_marks = self._grad_marks()
        return self.last_result

    def _grad_marks(self) -> Tuple[list, Optional[torch.Tensor]]:
        """What clip_grad_norm_ compares to know the gradients are still as
        reduced: each one's identity and in-place version counter (an
        earlier clip, most in-place changes), and its first and last
        elements (GradScaler.unscale_ scales every gradient in place
        without counting a version)."""
        grads = [p.grad for p in self.params]
        ids = [None if g is None else (id(g), g._version) for g in grads]
        ends = [e for g in grads if g is not None and g.numel()
                for e in (g.view(-1)[0], g.view(-1)[-1])]
        return ids, torch.stack(ends) if ends else None

    def _grads_as_reduced(self) -> bool:
        if self._reduced_marks is None:
            return False
        ids, ends = self._grad_marks()
        was_ids, was_ends = self._reduced_marks
        if ids != was_ids:
            return False
        if ends is None or was_ends is None:
            return ends is None and was_ends is None
        return bool(torch.equal(ends, was_ends))

    def _follow_daemon(self) -> None:
        # Once the step has ended: the gradients' stream waits for the
        # daemon's last unpack on the GPU. Not after a TimeoutError: the
        # step still runs, and the event holds no record of it yet.
        if self.device.type == "cuda":
            self.client.cuda_stream_wait(self._stream())

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the synchronised
        gradients, with the norm gradsyncd computed while it unpacked them
        (``last_result.grad_norm``): one pass over the gradients (none when
        they are within ``max_norm``) instead of two. It waits for the step
        first if one is in progress. The scaling is torch's: every gradient
        times ``min(max_norm / (total_norm + 1e-6), 1)``, in float32, with
        the total norm as a float32 tensor on the gradients' device, which
        it returns. The norm covers every gradient GradSync registered;
        gradsyncd sums the squares of their float32 values in float64, so
        it may differ from torch's own float32 sum in the last bits
        (relative 1e-6 at most in practice). Torch's function runs instead
        on the first call (from then on each step marks its gradients), and
        when that norm is not the gradients' own: another ``norm_type``,
        gradients not synchronised this step (under ``no_sync()``, or after
        a failed step), or gradients changed since they were reduced
        (``GradScaler.unscale_``, an earlier clip, any in-place change)."""
        if self._state == _OPEN:
            self.wait()
        result = self.last_result
        # The marks are taken from the first call on (they cost a few
        # microseconds per gradient a step): the first call is torch's.
        first, self._clips = not self._clips, True
        if (first or float(norm_type) != 2.0 or result is None or self._state != _REDUCED
                or not self._grads_as_reduced()):
            # In the model's order, as a caller would pass model.parameters().
            return torch.nn.utils.clip_grad_norm_(list(reversed(self.params)), max_norm,
                                                  norm_type,
                                                  error_if_nonfinite=error_if_nonfinite)
        grads = [p.grad for p in self.params if p.grad is not None]
        total = torch.tensor(result.grad_norm, dtype=torch.float32, device=self.device)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(f"The total norm of order {float(norm_type)} for gradients "
                               "from `parameters` is non-finite, so it cannot be clipped. "
                               "To disable this error and scale the gradients by the "
                               "non-finite norm anyway, set `error_if_nonfinite=False`")
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        # Times exactly 1 changes nothing (a NaN stays NaN): skip the pass.
        if grads and not bool(coef == 1.0):
            torch._foreach_mul_(grads, coef)
        return total

    def zero_grad(self) -> None:
        """Zeroes the gradients in place, keeping them in the shared memory
        (optimizer.zero_grad() works too, at the cost of one copy per
        gradient in the next backward). As ``zero_grad(set_to_none=False)``,
        it gives every parameter a zero gradient, which an optimizer then
        steps with even where no trainer uses the parameter; a parameter
        frozen since wrapping is left alone."""
        for i, g in enumerate(self._grads):
            if self.params[i].requires_grad:
                g.zero_()
                self.params[i].grad = g

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """A context in which backward() accumulates gradients locally
        without synchronising (gradient accumulation), as DDP's no_sync."""
        self._syncing = False
        try:
            yield
        finally:
            self._syncing = True

    def close(self) -> None:
        """Removes the hooks and closes the connection; the parameters keep
        their gradients (the shared memory stays mapped while they do)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.client.close()

    def __enter__(self) -> "GradSync":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def backward_and_update_half(loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                             threshold: Optional[int] = None, clipping: bool = False,
                             clip_value: float = 100, **connect: Any) -> StepResult:
    """The original framework's call, through gradsyncd: backpropagates
    ``loss``, clips each element of the local fp32 gradients to
    [-clip_value, clip_value] when ``clipping``, all-reduces them fused up
    to ``threshold`` elements (None: the job's, from the environment or
    gradsyncd's default of 2097152) in fp16, averaged over all trainers,
    and takes the optimizer's step. The first call connects (``connect``
    takes GradSync's other arguments: socket_path, local_rank, job_id,
    timeout, ...; the job comes from the environment as in GradSync) and
    registers the optimizer's parameters; returns the step's figures."""
    sync: Optional[GradSync] = getattr(optimizer, "_gradsync", None)
    if sync is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        sync = GradSync(params, threshold=threshold, wire="fp16", **connect)
        optimizer._gradsync = sync  # type: ignore[attr-defined]
    sync.clip_value = clip_value if clipping else None
    loss.backward()
    result = sync.wait()
    optimizer.step()
    return result
