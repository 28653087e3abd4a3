"""gradsync.torch launched as torchrun and srun launch trainers: two
"nodes" on this machine of two workers each (launched_trainer.py), each
node with a gradsyncd of its own (GRADSYNC_SOCKET), and the job's settings
in GRADSYNC_THRESHOLD and GRADSYNC_WIRE. The workers construct
`GradSync(model, optimizer=opt)` with no other argument: their ranks, the
node's trainers, the nodes, the node's rank and node 0's host come from
the launcher's variables through libgradsync, which gradsyncd checks
against its job.

- torchrun: two `python -m torch.distributed.run --nnodes 2 --node-rank N
  --nproc-per-node 2 --rdzv-backend static`, as on two machines;
- srun: the four workers started with the variables srun gives each task
  (SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID, SLURM_LOCALID,
  SLURM_NTASKS, SLURM_TASKS_PER_NODE, SLURM_NNODES, SLURM_NODEID) and
  MASTER_ADDR and MASTER_PORT as PyTorch's Slurm recipes export them.

In both:
- every worker says the job it was told: global rank of 4, 2 trainers on
  each of 2 nodes, its node rank, the threshold from the environment (not
  gradsyncd's default), several buckets;
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

from pylib import (HAVE_GLOO, LOOPBACK, Skip, check, check_eq, free_ports, job_daemon, run,
                   spawn)
from test_torch import STEPS, bound, max_diff
from torch_trainer import THRESHOLD

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "launched_trainer.py")
NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
SETTINGS = (("threshold", THRESHOLD), ("wire", "fp16"))
DEADLINE = 120  # seconds for every process of a launch, start to end

# What a launcher leaves in the environment: none of it may come from the
# shell that runs the test.
LAUNCHER_VARS = ("LOCAL_RANK", "RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def node_env(socket, **extra):
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith("SLURM_")
           and not (k.startswith("GRADSYNC_") and k != "GRADSYNC_LIBRARY")}
    env.update({f"GRADSYNC_{k.upper()}": str(v) for k, v in SETTINGS})
    env.update(GRADSYNC_SOCKET=socket, OMP_NUM_THREADS="1", **extra)
    return env


def torchrun(daemons, master_port, outdir):
    """One torchrun per node; returns [(process, log)]."""
    out = []
    for n, d in enumerate(daemons):
        log = os.path.join(outdir, f"torchrun{n}.log")
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}",
                f"--node-rank={n}", f"--nproc-per-node={PER_NODE}",
                f"--master-addr={LOOPBACK}", f"--master-port={master_port}",
                "--rdzv-backend=static", "--rdzv-id=gs-torchrun", "--max-restarts=0",
                "--monitor-interval=0.2", TRAINER, str(STEPS), outdir]
        out.append((spawn(argv, log, env=node_env(d.socket)), log))
    return out


def srun(daemons, master_port, outdir):
    """Each task as `srun --nodes 2 --ntasks-per-node 2` starts it, with
    MASTER_ADDR and MASTER_PORT from the batch script; returns
    [(process, log)]."""
    out = []
    for n, d in enumerate(daemons):
        for local in range(PER_NODE):
            rank = n * PER_NODE + local
            log = os.path.join(outdir, f"task{rank}.log")
            env = node_env(d.socket, SLURM_JOB_ID="4242", SLURM_STEP_ID="0",
                           SLURM_PROCID=str(rank), SLURM_LOCALID=str(local),
                           SLURM_NTASKS=str(WORLD),
                           # srun sets this one whether or not --ntasks-per-node
                           # was given (which alone sets SLURM_NTASKS_PER_NODE).
                           SLURM_TASKS_PER_NODE=f"{PER_NODE}(x{NODES})",
                           SLURM_NNODES=str(NODES), SLURM_NODEID=str(n),
                           MASTER_ADDR=LOOPBACK, MASTER_PORT=str(master_port))
            out.append((spawn([sys.executable, TRAINER, str(STEPS), outdir], log, env=env),
                        log))
    return out


def stop_all(procs, outdir):
    """Ends what the launch started: its processes (SIGTERM: a torchrun
    ends its workers), then any worker still there (torchrun starts each
    in a session of its own), by the pid it wrote."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
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
                if TRAINER.encode() in f.read():
                    os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass


def text(path):
    with open(path, errors="replace") as f:
        return f.read()


def launch(launcher):
    """Two node daemons, and the workers `launcher` starts; returns each
    global rank's results."""
    if not HAVE_GLOO:
        raise Skip("gradsyncd is built without Gloo")
    tmp = tempfile.mkdtemp(prefix="gs-launch-")
    node_port, master_port = free_ports(2)
    daemons = [job_daemon(PER_NODE, SETTINGS, NODES, n, node_port) for n in range(NODES)]
    started = []
    try:
        for d in daemons:
            d.wait_ready(60)
        start = time.monotonic()
        started = launcher(daemons, master_port, tmp)
        for p, log in started:
            left = max(1.0, DEADLINE - (time.monotonic() - start))
            try:
                rc = p.wait(left)
            except subprocess.TimeoutExpired:
                rc = None
            check(rc == 0, f"{' '.join(p.args[:4])} "
                  + (f"exited {rc}" if rc is not None else f"still runs after {DEADLINE} s")
                  + ":\n" + text(log) + "".join(f"\ngradsyncd of node {n}:\n" + d.log_text()
                                               for n, d in enumerate(daemons)))
        print(f"{launcher.__name__}: done in {time.monotonic() - start:.1f} s", flush=True)
        return [dict(np.load(os.path.join(tmp, f"rank{k}.npz"))) for k in range(WORLD)]
    finally:
        stop_all([p for p, _ in started], tmp)
        for d in daemons:
            d.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def model(res, name):
    """One of the three models a worker saved, as test_torch.py's results."""
    keys = sorted((k for k in res if k.startswith(name) and k[len(name):].isdigit()),
                  key=lambda k: int(k[len(name):]))
    return {"gmax": res["gmax"], **{f"p{i}": res[k] for i, k in enumerate(keys)}}


def check_launch(launcher):
    results = launch(launcher)
    what = launcher.__name__
    for k, res in enumerate(results):
        check_eq(res["job"].tolist()[:6], [k, WORLD, PER_NODE, NODES, k // PER_NODE, THRESHOLD],
                 f"{what}: rank {k}'s job (global rank, world, local size, nodes, node rank, "
                 "threshold)")
        check(res["job"][6] > 1, f"{what}: rank {k} has one bucket; the threshold was not "
              "the test's")
        check_eq(str(res["wire"]), "fp16", f"{what}: rank {k}'s wire dtype")
    ours = [model(res, "ours") for res in results]
    ddp = [model(res, "ddp") for res in results]
    for k in range(1, WORLD):
        check(max_diff(ours[0], ours[k]) == 0, f"{what}: rank {k}'s weights differ from "
              "rank 0's")
    tol = bound(ours + ddp, 2.0 ** -11)
    diff = max_diff(ours[0], ddp[0])
    alone = max_diff(ours[0], model(results[0], "alone"))
    print(f"{what}, 2 nodes x 2: largest weight difference from DDP + fp16_compress_hook "
          f"{diff:.3g}, bound {tol:.3g}; unsynchronised training differs by {alone:.3g}",
          flush=True)
    check(diff <= tol, f"{what}: weights differ from DDP's by {diff:.3g} > {tol:.3g}")
    check(alone > 10 * tol, f"{what}: the bound {tol:.3g} does not tell synchronised from "
          f"unsynchronised training ({alone:.3g})")


def test_torchrun_matches_ddp():
    check_launch(torchrun)


def test_srun_environment_matches_ddp():
    check_launch(srun)


if __name__ == "__main__":
    run([test_torchrun_matches_ddp, test_srun_environment_matches_ddp])
