"""Helpers of the Python tests: the operations tests' daemon and runner
(tests/ops/opslib.py), trainer processes running numpy_trainer.py, and an
independent NumPy model of what a reduce must give.

Paths come from the environment meson sets (see meson.build).
"""
import os
import socket
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.environ["GS_SOURCE_ROOT"], "tests", "ops"))
import opslib  # noqa: E402
from opslib import (HAVE_GLOO, Daemon, Skip, check, check_eq, spawn,  # noqa: E402,F401
                    wait_for)

HERE = os.path.dirname(os.path.abspath(__file__))
NUMPY_TRAINER = os.path.join(HERE, "numpy_trainer.py")
LOOPBACK = "127.0.0.1"


# The launcher variables libgradsync reads (opslib's list), cleared before
# each test so that one test's job never leaks into the next.
JOB_VARS = opslib.LAUNCH_VARS


def set_job(local_size=1, **settings):
    """The job of the trainers a test starts, in this process and the
    processes it starts: GRADSYNC_LOCAL_SIZE and the settings given
    (threshold=1000, wire="bf16", fusion_buffer=4096, ...), as a launcher
    would set them. gradsyncd takes the job from its first trainer."""
    for k in JOB_VARS:
        os.environ.pop(k, None)
    os.environ["GRADSYNC_LOCAL_SIZE"] = str(local_size)
    for k, v in settings.items():
        os.environ["GRADSYNC_" + k.upper()] = str(v)


def train_ranks(script, mode, steps, tmp, *extra, world=2, rank_args=lambda r: [],
                rank_env=lambda r: {}):
    """Runs `world` processes of the trainer script `script` (in this
    directory) in `mode`, rank r with the arguments extra and
    rank_args(r), and the variables rank_env(r) added to its environment;
    each saves its results to TMP/MODE-R.npz, which this returns, in rank
    order, once every one has exited 0."""
    procs = []
    for r in range(world):
        out, log = os.path.join(tmp, f"{mode}-{r}.npz"), os.path.join(tmp, f"{mode}-{r}.log")
        argv = [sys.executable, os.path.join(HERE, script), mode, str(r), str(steps),
                out] + list(extra) + rank_args(r)
        procs.append((spawn(argv, log, env={**os.environ, **rank_env(r)}), out, log))
    results = []
    for p, out, log in procs:
        rc = p.wait(300)
        check(rc == 0, f"{mode} trainer exited {rc}:\n" + open(log).read())
        results.append(dict(np.load(out)))
    return results


def run(tests):
    """opslib's runner, each test beginning with no job in the environment."""
    def fresh(t):
        def test():
            for k in JOB_VARS:
                os.environ.pop(k, None)
            t()
        test.__name__ = t.__name__
        return test
    opslib.run([fresh(t) for t in tests])


def free_ports(n):
    """n different TCP ports nothing is bound to now, below the kernel's
    ephemeral range (opslib.free_port)."""
    ports = set()
    while len(ports) < n:
        ports.add(opslib.free_port())
    return sorted(ports)


def free_port():
    return free_ports(1)[0]


def job_daemon(local_size, settings=(), nodes=1, node_rank=0, node_port=None):
    """gradsyncd as node `node_rank` of a job of `local_size` trainers on
    each of `nodes` nodes: with several nodes, each daemon listens for the
    others at its own loopback address (127.0.0.1 for node 0, 127.0.0.2
    for node 1, ...) on `node_port`, and the caller calls wait_ready() on
    each once all are started. The daemon takes no job: the trainers say it
    (local_size and settings, (("threshold", 4096), ("wire", "fp16")), are
    theirs to give, here through their launcher's environment)."""
    args = [f"--node-address=127.0.0.{node_rank + 1}", f"--node-port={node_port}"] \
        if nodes > 1 else []
    return Daemon(args, wait=nodes == 1)


class TrainerProc:
    """numpy_trainer.py in a process of its own."""

    def __init__(self, daemon, rank, counts, steps, *extra):
        self.out = os.path.join(daemon.dir, f"trainer{rank}.npz")
        self.log = os.path.join(daemon.dir, f"trainer{rank}.log")
        argv = [sys.executable, NUMPY_TRAINER, daemon.socket, str(rank),
                ",".join(map(str, counts)), str(steps), self.out] + list(extra)
        self.proc = spawn(argv, self.log)

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def wait_text(self, what, timeout=60):
        def seen():
            if what in self.text():
                return True
            if self.proc.poll() is not None:
                raise AssertionError(f"trainer exited {self.proc.returncode} before "
                                     f"'{what}':\n{self.text()}")
            return False
        wait_for(seen, timeout, f"trainer to print '{what}'")

    def results(self, timeout=120):
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"trainer still running after {timeout} s:\n{self.text()}")
        check(rc == 0, f"trainer exited {rc}:\n{self.text()}")
        return dict(np.load(self.out))


# ---- the reference --------------------------------------------------------------

def round_wire(x, wire):
    """fp32 values rounded to the wire dtype (nearest even) and widened."""
    x = np.asarray(x, dtype=np.float32)
    if wire == "fp32":
        return x.copy()
    if wire == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, r)


def reduce_reference(per_rank, wire, prescale, postscale, clips=None):
    """What every trainer must get back: each rank's gradient clipped (if
    its clip value is set), scaled by prescale and rounded to the wire
    dtype, summed in fp32 in rank order, rounded once more and scaled by
    postscale, all in fp32 (DESIGN.md, 'The function it generalises')."""
    acc = None
    for k, x in enumerate(per_rank):
        c = clips[k] if clips else None
        if c is not None:
            x = np.clip(x, np.float32(-c), np.float32(c))
        packed = round_wire(x * np.float32(prescale), wire)
        acc = packed if acc is None else (acc + packed).astype(np.float32)
    return (round_wire(acc, wire) * np.float32(postscale)).astype(np.float32)


def same_bits(got, want):
    """Equal bit for bit, except that any NaN equals any NaN."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan = np.isnan(got) & np.isnan(want)
    return got.shape == want.shape and bool(
        np.all((got.view(np.uint32) == want.view(np.uint32)) | nan))


def describe_diff(got, want):
    bad = ~((got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want)))
    i = int(np.argmax(bad))
    return (f"{int(bad.sum())} of {got.size} elements differ; first at {i}: "
            f"got {got[i]!r}, expected {want[i]!r}")
