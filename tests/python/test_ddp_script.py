"""A DDP training script of our own (ddp_script.py: a CNN with BatchNorm,
a DistributedSampler, replicas that start apart), run by torchrun as DDP
and, changed only in the README's three lines, with gradsync on the fp32
wire: on one node of two trainers and on two nodes of one trainer each
(a gradsyncd per node, as in test_launchers.py). Every parameter and
buffer (BatchNorm's running statistics included) of every rank ends bit
for bit as DDP's, and the ranks' replicas differ at the start, so the
comparison would fail without the broadcast at wrap."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from pylib import HAVE_GLOO, LOOPBACK, Skip, check, free_ports, job_daemon, run, spawn
from test_launchers import node_env, stop_all, text

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ddp_script.py")
DEADLINE = 180  # seconds for every process of a launch, start to end


def torchrun(outdir, nodes, per_node, sync, sockets, master_port):
    """torchrun, once per node; waits for them; returns nothing but fails
    with their logs."""
    procs = []
    for n in range(nodes):
        log = os.path.join(outdir, f"{sync}-{nodes}x{per_node}-node{n}.log")
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
                f"--node-rank={n}", f"--nproc-per-node={per_node}",
                f"--master-addr={LOOPBACK}", f"--master-port={master_port}",
                "--rdzv-backend=static", f"--rdzv-id=ddp-script-{nodes}x{per_node}",
                "--max-restarts=0", "--monitor-interval=0.2", SCRIPT, outdir]
        env = node_env(sockets[n] if sockets else "/nonexistent", SYNC=sync)
        env.pop("GRADSYNC_WIRE", None)  # the script says its wire
        env.pop("GRADSYNC_THRESHOLD", None)
        procs.append((spawn(argv, log, env=env), log))
    start = time.monotonic()
    try:
        for p, log in procs:
            left = max(1.0, DEADLINE - (time.monotonic() - start))
            try:
                rc = p.wait(left)
            except subprocess.TimeoutExpired:
                rc = None
            check(rc == 0, f"torchrun ({sync}, {nodes} x {per_node}) "
                  + (f"exited {rc}" if rc is not None else f"still runs after {DEADLINE} s")
                  + ":\n" + text(log))
    finally:
        stop_all([p for p, _ in procs], outdir)


def results(outdir, sync, world):
    return [dict(np.load(os.path.join(outdir, f"{sync}-rank{r}.npz"))) for r in range(world)]


def compare(ours, ddp, what):
    for r, (o, d) in enumerate(zip(ours, ddp)):
        check(sorted(o) == sorted(d), f"{what}: rank {r} saved other tensors than DDP's")
        for k in d:
            diff = float(np.max(np.abs(o[k].astype(np.float64) - d[k]))) if o[k].size else 0.0
            check(np.array_equal(o[k], d[k]),
                  f"{what}: rank {r}'s {k} differs from DDP's by {diff:.3g}")
    print(f"{what}: every parameter and buffer of every rank is DDP's, bit for bit",
          flush=True)


def test_script_matches_ddp_one_node_and_two():
    if not HAVE_GLOO:
        raise Skip("gradsyncd is built without Gloo")
    tmp = tempfile.mkdtemp(prefix="gs-ddp-script-")
    try:
        master_port, node_port = free_ports(2)
        torchrun(tmp, 1, 2, "ddp", None, master_port)
        ddp = results(tmp, "ddp", 2)
        # The parameters are the job's; each rank's buffers are what its
        # last forward left, from rank 0's broadcast before it.
        for k in ddp[0]:
            if "running" not in k and "num_batches" not in k:
                check(np.array_equal(ddp[0][k], ddp[1][k]), f"DDP's ranks end with other {k}")
        for nodes, per_node in ((1, 2), (2, 1)):
            daemons = [job_daemon(per_node, (), nodes, n, node_port) for n in range(nodes)]
            try:
                for d in daemons:
                    d.wait_ready(60)
                torchrun(tmp, nodes, per_node, "gradsync", [d.socket for d in daemons],
                         free_ports(1)[0])
            except AssertionError:
                for n, d in enumerate(daemons):
                    print(f"gradsyncd of node {n}:\n{d.log_text()}")
                raise
            finally:
                for d in daemons:
                    d.cleanup()
            compare(results(tmp, "gradsync", 2), ddp, f"torchrun {nodes} x {per_node}")
            for r in range(2):
                os.unlink(os.path.join(tmp, f"gradsync-rank{r}.npz"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run([test_script_matches_ddp_one_node_and_two])
