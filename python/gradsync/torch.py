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
mixed-precision loss scaler skip a step.

``rank``, ``world_size``, ``local_rank``, ``local_size``, ``node_rank`` and
``nodes`` say where the trainer sits in its job, as gradsyncd said at
connection, for what would otherwise need a process group:
``DistributedSampler(dataset, num_replicas=sync.world_size, rank=sync.rank)``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, List, Optional, Set, Union

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
    """

    def __init__(self, model: Params, threshold: Optional[int] = None,
                 wire: Optional[str] = None, clip_value: Optional[float] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None,
                 socket_path: Optional[str] = None, local_rank: Optional[int] = None,
                 job_id: Optional[str] = None, timeout: Optional[float] = None, *,
                 op: Optional[str] = None, predivide: Union[float, str, None] = None,
                 fusion_buffer: Optional[int] = None, local_size: Optional[int] = None,
                 nodes: Optional[int] = None, node_rank: Optional[int] = None,
                 coordinator: Optional[str] = None):
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
        try:
            self._grads = self._register(named)
        except BaseException:
            self.client.close()
            raise
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._marked = [False] * len(self.params)
        self._state = _IDLE
        # The backward passes (autograd graph tasks) whose ends wait for
        # the step: one callback per pass, queued by its first gradient.
        self._waiting_tasks: Set[int] = set()
        self._syncing = True
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready)
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
        for (_, p), g in zip(named, grads):
            p.grad = g
        return grads

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
            # synchronises them instead of returning the last result.
            if self._state == _REDUCED:
                self._state = _IDLE
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

        A parameter that got no gradient this step takes part with zeros
        (as DDP with find_unused_parameters). Raises StepAborted when the
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
        rest = [i for i, m in enumerate(self._marked) if not m]
        for i in rest:
            self._bind(i)
        if rest:
            self._mark(rest)
        self._marked = [False] * len(self.params)
        self._state = _IDLE  # until the step is known to have ended well
        try:
            self.last_result = self.client.wait(self.timeout)
        except StepAborted:
            self._follow_daemon()
            raise
        self._follow_daemon()
        self._state = _REDUCED
        return self.last_result

    def _follow_daemon(self) -> None:
        # Once the step has ended: the gradients' stream waits for the
        # daemon's last unpack on the GPU. Not after a TimeoutError: the
        # step still runs, and the event holds no record of it yet.
        if self.device.type == "cuda":
            self.client.cuda_stream_wait(self._stream())

    def zero_grad(self) -> None:
        """Zeroes the gradients in place, keeping them in the shared memory
        (optimizer.zero_grad() works too, at the cost of one copy per
        gradient in the next backward)."""
        for i, g in enumerate(self._grads):
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
