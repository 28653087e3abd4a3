"""The gradsync Python package against a real gradsyncd: results of every
wire dtype and reduce op equal a NumPy reference bit for bit, errors arrive
as exceptions carrying the library's code and the daemon's message, and the
control calls agree with what the trainers did.

Each trainer is a process of its own (numpy_trainer.py); the test process
is one more trainer, or a control client, where a case needs one.
"""
import contextlib
import os
import select
import signal
import time

import numpy as np

import gradsync
from numpy_trainer import inputs
from pylib import (Daemon, TrainerProc, check, check_eq, describe_diff, job_daemon, set_job,
                   reduce_reference, run, same_bits)

# Sizes chosen so that, with --threshold 1000, the plan has small fused
# buckets, a tensor above the threshold in the middle of a pending group,
# and a tensor larger than the 4096-element fusion buffer (chunked).
COUNTS = [300, 500, 7, 1200, 260, 9000, 40, 3]
THRESHOLD = 1000
DAEMON_ARGS = ["--step-timeout=60"]


def scales(world, op):
    """prescale and postscale of a world of `world` ranks under the default
    predivide (the world size), as DESIGN.md states them."""
    pre = 1.0 / world
    post = 1.0 if op == "average" else float(world)
    return np.float32(pre), np.float32(post)


def sync_and_check(wire, op, trainers=3, steps=3, clips=None, nan=False):
    set_job(trainers, threshold=THRESHOLD, fusion_buffer=4096, wire=wire, op=op)
    d = Daemon(DAEMON_ARGS)
    try:
        clips = clips or [None] * trainers
        procs = []
        for r in range(trainers):
            extra = (["--clip", str(clips[r])] if clips[r] is not None else []) + \
                (["--nan"] if nan else [])
            procs.append(TrainerProc(d, r, COUNTS, steps, *extra))
        # The job, of one node, goes with its trainers: its wire dtype
        # shows in the results' bits, compared with the reference's.
        outs = [p.results() for p in procs]
        pre, post = scales(trainers, op)
        for step in range(1, steps + 1):
            nonfinite = 0
            per_rank_clipped = [0] * trainers
            for t, c in enumerate(COUNTS):
                xs = [inputs(r, step, c, t) for r in range(trainers)]
                if nan and t == 0:
                    xs[0][0] = np.nan
                for r in range(trainers):
                    if clips[r] is not None:
                        per_rank_clipped[r] += int(np.sum((xs[r] > clips[r]) |
                                                          (xs[r] < -clips[r])))
                want = reduce_reference(xs, wire, pre, post, clips)
                nonfinite += int(np.sum(~np.isfinite(want)))
                for r in range(trainers):
                    got = outs[r][f"s{step}t{t}"]
                    check(same_bits(got, want),
                          f"{wire}/{op} step {step} tensor {t} rank {r}: "
                          + describe_diff(got, want))
            for r in range(trainers):
                res = outs[r][f"s{step}result"]
                check_eq(int(res[0]), step, "step number")
                check_eq(int(res[3]), per_rank_clipped[r], f"clipped count of rank {r}")
                check_eq(int(res[4]), nonfinite, f"non-finite count of rank {r}")
        if nan:
            check(nonfinite > 0, "the NaN input gave no non-finite output")
    finally:
        d.cleanup()


def test_fp16_average_equals_reference():
    sync_and_check("fp16", "average")


def test_bf16_sum_equals_reference():
    sync_and_check("bf16", "sum", trainers=2)


def test_fp32_average_equals_reference():
    sync_and_check("fp32", "average")


def test_clipping_and_nonfinite_counts():
    sync_and_check("fp16", "average", trainers=2, steps=2, clips=[0.5, None], nan=True)


def one_trainer_daemon(*args):
    set_job(1)
    return Daemon(list(args))


def test_step_in_process_with_poll_and_fileno():
    d = one_trainer_daemon()
    try:
        with gradsync.Client(d.socket) as c:
            check_eq(c.info.world_size, 1, "world size")
            check_eq(c.info.backend, "host", "backend")
            g = c.register([("w", 1000), ("b", 10)])
            check_eq((c.tensor_count, len(g), g[0].dtype, g[0].shape),
                     (2, 2, np.float32, (1000,)), "registered tensors")
            x = inputs(0, 1, 1000, 0)
            g[0][:] = x
            g[1][:] = 3.0
            c.begin_step()
            check(c.poll() is None, "poll() returned a result before anything was ready")
            c.mark_ready([0, 1])
            deadline = time.monotonic() + 30
            result = None
            while result is None and time.monotonic() < deadline:
                select.select([c.fileno()], [], [], 1.0)
                result = c.poll()
            check(result is not None, "no result through poll() within 30 s")
            check(not result.aborted and result.step == 1, f"result {result}")
            check(same_bits(g[0], reduce_reference([x], "fp16", 1, 1)), "world of one")
            check(c.tensor_reduced(0) and c.tensor_reduced(1), "tensors reported reduced")
    finally:
        d.cleanup()


def expect_error(cls, code, fn, *needles):
    try:
        fn()
    except cls as e:
        check_eq(e.code, code, f"code of {e!r}")
        for n in needles:
            check(n in e.message, f"'{n}' not in the message: {e.message!r}")
        return e
    raise AssertionError(f"no {cls.__name__} raised")


def test_errors_carry_code_and_message():
    e = expect_error(gradsync.ConnectError, -3,
                     lambda: gradsync.Client("/nonexistent/gs.sock", timeout=2),
                     "/nonexistent/gs.sock")
    check(isinstance(e, ConnectionError), "ConnectError is a ConnectionError")
    check_eq(e.name, "GS_ECONNECT", "error name")
    d = one_trainer_daemon()
    try:
        # A local rank the daemon has no slot for: its own words come back.
        try:
            gradsync.Client(d.socket, local_rank=5, timeout=5)
            raise AssertionError("local rank 5 of 1 accepted")
        except gradsync.GradSyncError as err:
            check("5" in err.message and "local" in err.message,
                  f"the daemon's reason is missing: {err.message!r}")
        with gradsync.Client(d.socket) as c:
            # CUDA tensors need the cuda backend, which this machine lacks.
            expect_error(gradsync.StateError, -12,
                         lambda: c.register_cuda([("w", 16, 0x7F0000000000)]),
                         "host backend", "--backend cuda")
        with gradsync.Client(d.socket) as c:
            expect_error(gradsync.StateError, -12, lambda: c.begin_step())
            c.register([("w", 16)])
            c.begin_step()
            expect_error(gradsync.StateError, -12, lambda: c.begin_step())
            err = expect_error(gradsync.InvalidArgumentError, -1, lambda: c.mark_ready([1]))
            check(isinstance(err, ValueError), "InvalidArgumentError is a ValueError")
            try:
                c.tensor(3)
                raise AssertionError("tensor(3) of 1 returned")
            except IndexError:
                pass
            expect_error(gradsync.TimeoutError, -5, lambda: c.wait(timeout=0.2))
            c.mark_ready([0])
            c.wait(timeout=30)
        expect_error(gradsync.StateError, -12, lambda: c.begin_step(), "closed")
    finally:
        d.cleanup()


@contextlib.contextmanager
def environment(**values):
    """The process's environment, which libgradsync reads, with `values`
    set for the block."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_job_from_environment_and_arguments():
    """Client() leaves each field of the job and each of its settings to
    libgradsync, which derives it from the environment; an argument
    overrides its variable and is sent as the job's. gradsyncd refuses a
    trainer whose view, from either, differs from its job's, naming both
    values; a value the C struct cannot carry is refused before."""
    settings = (("threshold", 1000), ("wire", "bf16"), ("op", "sum"))
    d = job_daemon(2, settings)
    refused = lambda what, **kw: expect_error(  # noqa: E731
        gradsync.RefusedError, -16, lambda: gradsync.Client(d.socket, **kw),
        f"this trainer says {what}")
    try:
        # The job's first trainer, all from the environment.
        with environment(LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                         **{f"GRADSYNC_{k.upper()}": str(v) for k, v in settings}):
            first = gradsync.Client(d.socket)
        i = first.info
        check_eq((i.global_rank, i.local_size, i.threshold, i.wire_dtype, i.op),
                 (1, 2, 1000, "bf16", "sum"), "the job from the environment")
        place = lambda c: (c.rank, c.world_size, c.local_rank, c.local_size,  # noqa: E731
                           c.node_rank, c.nodes)
        check_eq(place(first), (1, 2, 1, 2, 0, 1), "(rank, world_size, local_rank, "
                 "local_size, node_rank, nodes) from LOCAL_RANK=1, LOCAL_WORLD_SIZE=2")
        with environment(LOCAL_RANK="1", GRADSYNC_THRESHOLD="999"):
            with gradsync.Client(d.socket, local_rank=0, threshold=1000) as c:
                check_eq(c.info.global_rank, 0, "local_rank=0 over LOCAL_RANK=1")
                check_eq(place(c), (0, 2, 0, 2, 0, 1), "the place of local_rank=0")
            refused("threshold 999, the job has 1000", local_rank=0)
        refused("threshold 1001, the job has 1000", threshold=1001)
        with environment(GRADSYNC_WIRE="fp16"):
            refused("wire dtype fp16, the job has bf16")
            refused("threshold 1, the job has 1000", threshold=1, wire="bf16")
        with environment(LOCAL_WORLD_SIZE="3"):
            refused("local size 3, the job has 2")
        refused("op average, the job has sum", op="average")
        refused("predivide 2, the job has world", predivide=2)
        refused("fusion buffer 8192, the job has 4194304", fusion_buffer=8192)
        refused("node count 2, the job has 1", nodes=2, node_rank=1)
        with environment(LOCAL_RANK="x"):
            expect_error(gradsync.InvalidArgumentError, -1, lambda: gradsync.Client(d.socket),
                         "LOCAL_RANK (torchrun)", "'x'")
        for name, value in [("local_rank", -1), ("threshold", 2 ** 64), ("nodes", True),
                            ("wire", "fp8"), ("op", "max"), ("predivide", -1),
                            ("fusion_buffer", 0)]:
            expect_error(gradsync.InvalidArgumentError, -1,
                         lambda: gradsync.Client(d.socket, **{name: value}), name)
        with gradsync.Control(d.socket) as ctl:
            check_eq([t["local_rank"] for t in ctl.status()["trainers"]], [1],
                     "trainers left after the refusals")
        first.close()
    finally:
        d.cleanup()


def test_launch_info_is_a_dry_run():
    """gradsync.launch_info() says what a trainer started here would derive,
    and from where, without a daemon: torchrun's variables, a GRADSYNC_*
    setting, an argument over both, and a bad value named."""
    with environment(LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", WORLD_SIZE="4", GROUP_RANK="1",
                     MASTER_ADDR="node0", TORCHELASTIC_RUN_ID="run9",
                     GRADSYNC_WIRE="bf16"):
        li = gradsync.launch_info()
        check_eq((li.job_id, li.local_rank, li.local_size, li.nodes, li.node_rank,
                  li.coordinator, li.wire, li.threshold),
                 ("run9", 1, 2, 2, 1, "node0", "bf16", None), "the derived job")
        check_eq((li.job_id_source, li.local_size_source, li.nodes_source, li.wire_source,
                  li.threshold_source),
                 ("TORCHELASTIC_RUN_ID (torchrun)", "LOCAL_WORLD_SIZE (torchrun)",
                  "WORLD_SIZE / LOCAL_WORLD_SIZE (torchrun)", "GRADSYNC_WIRE", "unset"),
                 "the sources")
        li = gradsync.launch_info(local_rank=0, threshold=4096, predivide="world")
        check_eq((li.local_rank, li.local_rank_source, li.threshold, li.predivide),
                 (0, "gs_connect_options", 4096, "world"), "arguments over the environment")
    with environment(LOCAL_RANK="x"):
        expect_error(gradsync.InvalidArgumentError, -1, gradsync.launch_info,
                     "LOCAL_RANK (torchrun)", "'x'")


def test_layout_mismatch_names_the_tensor():
    set_job(2)
    d = Daemon([])
    try:
        other = TrainerProc(d, 0, [100, 50], 1)
        other.wait_text("registered")
        with gradsync.Client(d.socket, local_rank=1) as c:
            e = expect_error(gradsync.LayoutError, -9,
                             lambda: c.register([("t0", 100), ("t1", 51)]))
            check("51" in e.message and "50" in e.message,
                  f"the daemon's message does not give both sizes: {e.message!r}")
    finally:
        d.cleanup()


def test_abort_when_a_trainer_dies():
    set_job(2)
    d = Daemon([])
    try:
        other = TrainerProc(d, 0, [100, 200, 300, 400], 1, "--hold-at", "1")
        with gradsync.Client(d.socket, local_rank=1) as c:
            g = c.register([(f"t{i}", n) for i, n in enumerate([100, 200, 300, 400])])
            for a in g:
                a[:] = 7.0
            other.wait_text("holding")
            c.begin_step()
            c.mark_ready([0, 1, 2, 3])
            other.proc.send_signal(signal.SIGKILL)
            t0 = time.monotonic()
            e = expect_error(gradsync.StepAborted, -13, lambda: c.wait(timeout=30),
                             "local rank 0")
            check(time.monotonic() - t0 < 5, "abort took more than 5 s")
            check(e.result is not None and e.result.aborted, f"result {e.result}")
            for i, a in enumerate(g):
                if not c.tensor_reduced(i):
                    check(np.all(a == 7.0), f"tensor {i} not reduced but changed")
    finally:
        d.cleanup()


def test_control_agrees_with_trainers():
    set_job(2)
    d = Daemon([])
    try:
        procs = [TrainerProc(d, r, [1000, 10], 4) for r in range(2)]
        for p in procs:
            p.results()
        with gradsync.Control(d.socket) as ctl:
            st = ctl.status()
            # The node's totals keep the steps of the job, which went with
            # its trainers (a job of one node has no group to keep).
            check_eq(st["steps_completed"], 4, "steps completed")
            check_eq(st["jobs"], [], "jobs after their trainers left")
            metrics = ctl.metrics()
            line = [ln for ln in metrics.splitlines() if ln.startswith("gradsync_steps_total")]
            check(line and float(line[0].split()[-1]) == 4, f"steps in metrics: {line}")
            me = [c for c in ctl.clients() if c["self"]]
            check(len(me) == 1 and me[0]["role"] == "control" and me[0]["pid"] == os.getpid(),
                  f"own connection: {me}")
            path = os.path.join(d.dir, "trace.json")
            check(ctl.trace_start(path)["active"], "trace active")
            check(not ctl.trace_stop()["active"], "trace stopped")
            check(os.path.getsize(path) > 0, "trace file empty")
    finally:
        d.cleanup()


def test_caller_memfd_is_adopted():
    """A tensor in a memfd of the caller's (sealed against shrinking, at an
    offset): the daemon reads and writes that memory, seen here through an
    mmap of our own."""
    import fcntl
    import mmap
    count, offset = 1000, 4096
    fd = os.memfd_create("gs-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    d = one_trainer_daemon()
    try:
        os.ftruncate(fd, offset + 4 * count)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        mem = mmap.mmap(fd, offset + 4 * count)
        mine = np.frombuffer(mem, dtype=np.float32, count=count, offset=offset)
        x = inputs(0, 1, count, 0)
        mine[:] = x
        with gradsync.Client(d.socket) as c:
            views = c.register([gradsync.TensorSpec("w", count, memfd=fd, offset=offset)])
            check(same_bits(views[0], x), "the library's view of the caller's memfd")
            with c.step() as s:
                s.mark_ready([0])
            check(same_bits(mine, reduce_reference([x], "fp16", 1, 1)),
                  "the reduced result in the caller's own mapping")
            del views
        del mine
        mem.close()
        # Unsealed memory is refused with the daemon's reason.
        fd2 = os.memfd_create("gs-test-unsealed", os.MFD_CLOEXEC)
        os.ftruncate(fd2, 4 * count)
        with gradsync.Client(d.socket) as c:
            e = expect_error(gradsync.BufferError, -10,
                             lambda: c.register([gradsync.TensorSpec("w", count, memfd=fd2)]))
            check("seal" in e.message, f"the reason does not name the seals: {e.message!r}")
        os.close(fd2)
    finally:
        os.close(fd)
        d.cleanup()


def test_reconnect_after_daemon_restart():
    """gradsyncd killed while a trainer waits: DisconnectedError at once;
    after a new gradsyncd on the same socket, reconnect() registers the
    same memory again and the step runs."""
    d = one_trainer_daemon()
    try:
        with gradsync.Client(d.socket) as c:
            g = c.register([("w", 500), ("b", 5)])
            x = inputs(0, 2, 500, 0)
            g[0][:] = x
            g[1][:] = 1.0
            c.begin_step()
            c.mark_ready([1])  # tensor 0 never comes: the step waits
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait(10)
            t0 = time.monotonic()
            expect_error(gradsync.DisconnectedError, -4, lambda: c.wait(timeout=30))
            check(time.monotonic() - t0 < 5, "the disconnection took more than 5 s to show")
            os.unlink(d.socket)
            d2 = Daemon([], tmp=d.dir)
            c.reconnect(timeout=10)
            g[0][:] = x
            with c.step() as s:
                s.mark_ready([0, 1])
            check(same_bits(g[0], reduce_reference([x], "fp16", 1, 1)),
                  "the step after reconnect()")
            d2.stop()
    finally:
        d.cleanup()


def test_arrays_keep_memory_until_dropped():
    """close() ends the session at once (the daemon frees the local rank,
    so that a model whose gradients outlive it can be wrapped again); the
    memory stays mapped while an array over it lives."""
    d = one_trainer_daemon()
    try:
        c = gradsync.Client(d.socket)
        g = c.register([("w", 64)])
        g[0][:] = 2.5
        c.close()
        check(float(g[0].sum()) == 160.0, "an array over a closed client's memory")

        def trainers():
            with gradsync.Control(d.socket) as ctl:
                return len(ctl.status()["trainers"])
        deadline = time.monotonic() + 10
        while trainers() and time.monotonic() < deadline:
            time.sleep(0.05)
        check_eq(trainers(), 0, "trainers after close() while an array lives")
        with gradsync.Client(d.socket) as again:
            h = again.register([("w", 64)])
            check(float(h[0].sum()) == 0.0, "the new session's memory")
        g[0][:] = 1.0
        check(float(g[0].sum()) == 64.0, "the closed session's array after a new session")
        del g, h
    finally:
        d.cleanup()

if __name__ == "__main__":
    run([test_fp16_average_equals_reference, test_bf16_sum_equals_reference,
         test_fp32_average_equals_reference, test_clipping_and_nonfinite_counts,
         test_step_in_process_with_poll_and_fileno, test_errors_carry_code_and_message,
         test_job_from_environment_and_arguments, test_launch_info_is_a_dry_run,
         test_layout_mismatch_names_the_tensor, test_abort_when_a_trainer_dies,
         test_control_agrees_with_trainers, test_caller_memfd_is_adopted,
         test_reconnect_after_daemon_restart,
         test_arrays_keep_memory_until_dropped])
