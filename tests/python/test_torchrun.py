"""gradsync.torch under torchrun itself: two "nodes" on this machine, each
a `python -m torch.distributed.run --nnodes 2 --node-rank N
--nproc-per-node 2` of torchrun_trainer.py with a gradsyncd of its own
(GRADSYNC_SOCKET), and the job's settings in GRADSYNC_THRESHOLD and
GRADSYNC_WIRE. The workers construct `GradSync(model, optimizer=opt)` with
no other argument: their ranks, the node's trainers, the nodes, the node's
rank and node 0's host come from torchrun's variables through
libgradsync, which gradsyncd checks against its job.

- every worker says the job it was told: global rank $RANK of 4, 2
  trainers on each of 2 nodes, node rank $GROUP_RANK, the threshold from
  the environment (not gradsyncd's default), several buckets;
- the four workers end with the same weights, within fp16 rounding of
  DDP on Gloo with the fp16 compress hook over the same data in the same
  processes (test_torch.py's bound), and far from training alone.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from pylib import (HAVE_GLOO, LOOPBACK, Skip, check, check_eq, free_port, node_daemon, run,
                   spawn)
from test_torch import STEPS, bound, max_diff
from torch_trainer import THRESHOLD

HERE = os.path.dirname(os.path.abspath(__file__))
NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
SETTINGS = (("threshold", THRESHOLD), ("wire", "fp16"))
DEADLINE = 120  # seconds for both torchruns, start to end

# What a launcher leaves in the environment: none of it may come from the
# shell that runs the test.
LAUNCHER_VARS = ("LOCAL_RANK", "RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def node_env(socket):
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith("SLURM_")
           and not (k.startswith("GRADSYNC_") and k != "GRADSYNC_LIBRARY")}
    env.update({f"GRADSYNC_{k.upper()}": str(v) for k, v in SETTINGS})
    env.update(GRADSYNC_SOCKET=socket, OMP_NUM_THREADS="1")
    return env


def torchrun(node_rank, master_port, outdir, log, socket):
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}",
            f"--node-rank={node_rank}", f"--nproc-per-node={PER_NODE}",
            f"--master-addr={LOOPBACK}", f"--master-port={master_port}",
            "--rdzv-backend=static", "--rdzv-id=gs-torchrun", "--max-restarts=0",
            "--monitor-interval=0.2", os.path.join(HERE, "torchrun_trainer.py"),
            str(STEPS), outdir]
    return spawn(argv, log, env=node_env(socket))


def stop_all(runs, outdir):
    """Ends the torchruns (SIGTERM: each ends its workers), then any worker
    still there (torchrun starts each in a session of its own), by the pid
    it wrote."""
    for p in runs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in runs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
    for name in os.listdir(outdir):
        if not name.startswith("pid"):
            continue
        pid = int(open(os.path.join(outdir, name)).read())
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"torchrun_trainer.py" in f.read():
                    os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            pass


def text(path):
    with open(path, errors="replace") as f:
        return f.read()


def test_gradsync_under_torchrun_matches_ddp():
    if not HAVE_GLOO:
        raise Skip("gradsyncd is built without Gloo")
    tmp = tempfile.mkdtemp(prefix="gs-torchrun-")
    node_port, master_port = free_port(), free_port()
    daemons = [node_daemon(r, NODES, PER_NODE, node_port, SETTINGS) for r in range(NODES)]
    runs, logs = [], [os.path.join(tmp, f"torchrun{r}.log") for r in range(NODES)]
    try:
        for d in daemons:
            d.wait_ready(60)
        start = time.monotonic()
        runs = [torchrun(r, master_port, tmp, logs[r], daemons[r].socket)
                for r in range(NODES)]
        for r, p in enumerate(runs):
            left = max(1.0, DEADLINE - (time.monotonic() - start))
            try:
                rc = p.wait(left)
            except subprocess.TimeoutExpired:
                rc = None
            check(rc == 0, f"torchrun of node {r} "
                  + (f"exited {rc}" if rc is not None else f"still runs after {DEADLINE} s")
                  + ":\n" + text(logs[r]) + "\ngradsyncd:\n" + daemons[r].log_text())
        print(f"both torchruns done in {time.monotonic() - start:.1f} s", flush=True)
        results = [dict(np.load(os.path.join(tmp, f"rank{k}.npz"))) for k in range(WORLD)]
    finally:
        stop_all(runs, tmp)
        for d in daemons:
            d.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)

    for k, res in enumerate(results):
        check_eq(res["job"].tolist()[:6], [k, WORLD, PER_NODE, NODES, k // PER_NODE, THRESHOLD],
                 f"rank {k}'s job (global rank, world, local size, nodes, node rank, "
                 "threshold)")
        check(res["job"][6] > 1, f"rank {k}: one bucket; the threshold was not the test's")
        check_eq(str(res["wire"]), "fp16", f"rank {k}'s wire dtype")

    def model(res, name):
        keys = sorted((k for k in res if k.startswith(name) and k[len(name):].isdigit()),
                      key=lambda k: int(k[len(name):]))
        return {"gmax": res["gmax"], **{f"p{i}": res[k] for i, k in enumerate(keys)}}

    ours = [model(res, "ours") for res in results]
    ddp = [model(res, "ddp") for res in results]
    for k in range(1, WORLD):
        check(max_diff(ours[0], ours[k]) == 0, f"rank {k}'s weights differ from rank 0's")
    tol = bound(ours + ddp, 2.0 ** -11)
    diff = max_diff(ours[0], ddp[0])
    alone = max_diff(ours[0], model(results[0], "alone"))
    print(f"torchrun, 2 nodes x 2: largest weight difference from DDP + fp16_compress_hook "
          f"{diff:.3g}, bound {tol:.3g}; unsynchronised training differs by {alone:.3g}",
          flush=True)
    check(diff <= tol, f"weights differ from DDP's by {diff:.3g} > {tol:.3g}")
    check(alone > 10 * tol, f"the bound {tol:.3g} does not tell synchronised from "
          f"unsynchronised training ({alone:.3g})")


if __name__ == "__main__":
    run([test_gradsync_under_torchrun_matches_ddp])
