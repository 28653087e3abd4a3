"""The state broadcast's time against torch.distributed.broadcast (Gloo,
CPU tensors) of the same tensors, in the same run: PROCS trainers on this
machine, one gradsyncd, the state of a model's parameter layout
(layouts/resnet50.txt, layouts/bert-base.txt: float32 tensors of those
sizes). Each system broadcasts from rank 0, REPEAT times after a warm-up;
the figure is the median over the repeats of the slowest rank's time.

    state_broadcast.py --daemon build/daemon/gradsyncd --layout layouts/resnet50.txt

On one node this compares gradsyncd's copy through shared memory against
Gloo over loopback. Between nodes (bench/state-broadcast.sh --cluster, on
scripts/netcluster.sh) each node runs one rank of one system:

    state_broadcast.py rank {gradsync|torch} K --world N --layout L --repeat R
        [--socket S | --init FILE] --out JSON

which writes that rank's times (seconds per repeat, after a warm-up) to
JSON; gradsync's job comes from the GRADSYNC_* environment.
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time


def read_layout(path):
    out = []
    for line in open(path):
        if line.strip() and not line.startswith("#"):
            name, count = line.split()[:2]
            out.append((name, int(count)))
    return out


def gradsync_rank(rank, procs, socket, layout, repeat, q):
    import gradsync
    os.environ["GRADSYNC_LOCAL_SIZE"] = str(procs)
    os.environ["GRADSYNC_JOB_ID"] = "state-bench"
    timed_broadcasts(gradsync.Client(socket, local_rank=rank), rank, layout, repeat, q)


def timed_broadcasts(c, rank, layout, repeat, q):
    """Registers the layout's state on client c, filled with `rank`,
    broadcasts it from global rank 0 repeat + 1 times, checks it is rank
    0's and puts (rank, the times after the first) on q."""
    arrays = c.register_state([(n, 4 * k, "float32") for n, k in layout])
    for a in arrays:
        a[:] = rank
    times = []
    for i in range(repeat + 1):
        t0 = time.perf_counter()
        c.broadcast_state(0)
        times.append(time.perf_counter() - t0)
    assert all(int(a[0]) == 0 and int(a[-1]) == 0 for a in arrays), "not rank 0's state"
    q.put((rank, times[1:]))
    c.close()


def torch_rank(rank, procs, init, layout, repeat, q):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=procs)
    tensors = [torch.full((k,), float(rank)) for _, k in layout]
    times = []
    for i in range(repeat + 1):
        dist.barrier()
        t0 = time.perf_counter()
        for t in tensors:
            dist.broadcast(t, 0)
        times.append(time.perf_counter() - t0)
    assert all(float(t[0]) == 0 for t in tensors)
    q.put((rank, times[1:]))
    dist.destroy_process_group()


def run(target, procs, args):
    q = mp.Queue()
    ps = [mp.Process(target=target, args=(r, procs) + args + (q,)) for r in range(procs)]
    for p in ps:
        p.start()
    got = dict(q.get(timeout=600) for _ in ps)
    for p in ps:
        p.join(60)
        if p.exitcode != 0:
            sys.exit(f"{target.__name__} rank exited {p.exitcode}")
    per_repeat = [max(got[r][i] for r in got) for i in range(len(got[0]))]
    return statistics.median(per_repeat)


def one_rank(argv):
    """One rank of one system on a node of the cluster (see the top)."""
    ap = argparse.ArgumentParser(prog="state_broadcast.py rank")
    ap.add_argument("system", choices=["gradsync", "torch"])
    ap.add_argument("rank", type=int)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--layout", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--socket")
    ap.add_argument("--init")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    layout = read_layout(a.layout)
    q = mp.Queue()
    if a.system == "gradsync":
        gradsync_one(a.rank, a.socket, layout, a.repeat, q)
    else:
        torch_rank(a.rank, a.world, a.init, layout, a.repeat, q)
    _, times = q.get()
    with open(a.out, "w") as f:
        json.dump({"system": a.system, "rank": a.rank, "bytes": 4 * sum(k for _, k in layout),
                   "times": times}, f)


def gradsync_one(rank, socket, layout, repeat, q):
    """A node's only trainer (local rank 0) of global rank `rank`."""
    import gradsync
    timed_broadcasts(gradsync.Client(socket, local_rank=0), rank, layout, repeat, q)


def main():
    if sys.argv[1:2] == ["rank"]:
        return one_rank(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--layout", action="append", required=True)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    mp.set_start_method("spawn")
    print(f"{'layout':<14} {'MB':>7} {'gradsync s':>11} {'GB/s':>6} {'gloo s':>8} {'GB/s':>6} "
          f"{'gloo/gradsync':>13}")
    for path in a.layout:
        layout = read_layout(path)
        nbytes = 4 * sum(k for _, k in layout)
        with tempfile.TemporaryDirectory() as tmp:
            sock = os.path.join(tmp, "gs.sock")
            d = subprocess.Popen([a.daemon, f"--socket={sock}", "--node-port=0"],
                                 stderr=open(os.path.join(tmp, "d.log"), "w"))
            try:
                for _ in range(300):
                    if os.path.exists(sock):
                        break
                    time.sleep(0.1)
                g = run(gradsync_rank, a.procs, (sock, layout, a.repeat))
            finally:
                d.terminate()
                d.wait(30)
            t = run(torch_rank, a.procs, (os.path.join(tmp, "init"), layout, a.repeat))
        name = os.path.basename(path).rsplit(".", 1)[0]
        print(f"{name:<14} {nbytes / 1e6:7.1f} {g:11.4f} {nbytes / g / 1e9:6.2f} {t:8.4f} "
              f"{nbytes / t / 1e9:6.2f} {t / g:13.1f}", flush=True)


if __name__ == "__main__":
    main()
