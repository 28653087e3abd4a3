"""Times a restarted trainer, from just before it connects to just after its
first step is done, on 2 nodes x 1 trainer (two gradsyncd on 127.0.0.1 and
127.0.0.2 of this machine), in three ways taking turns in one run:

  kept   gradsync, the job's group kept: the same job id and shape, back
         within --job-linger, so no rendezvous and no new Gloo group;
  new    gradsync, a new job id each time: a new rendezvous and Gloo group;
  ddp    PyTorch: init_process_group("gloo") + DistributedDataParallel(model)
         + the first backward's all-reduce.

The model is a ParameterList of a real model's gradient layout
(layouts/NAME.txt), the loss a cheap function of every parameter. Every
repetition starts fresh trainer processes, lets them import and build the
model, then starts both clocks at once; its figure is the slower node's.
Checks, beside the timing, that the kept job built no group on either
daemon (gradsync_groups_built_total did not grow) while each new job built
one on each, and that every first step's gradients are the average.

Prints a table (median, min - max, each value; ratios to `kept`) and writes
the repetitions to OUT/restart.csv and the table to OUT/restart.txt.
"""
import argparse
import ctypes
import os
import platform
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
LAYOUTS = os.path.join(os.path.dirname(HERE), "..", "layouts")
MODES = ["kept", "new", "ddp"]
NAMES = {"kept": "gradsync, group kept", "new": "gradsync, new group",
         "ddp": "PyTorch DDP on Gloo"}
NODES = 2
GO_TIMEOUT = 120      # seconds a started trainer has to import and build its model
STEP_TIMEOUT = 120    # seconds from the go to a trainer's figure
DAEMON_TIMEOUT = 30   # seconds for a daemon to answer, or a job's trainers to go


def read_layout(name):
    """(names, counts) of layouts/NAME.txt: '#' comments and blank lines,
    then one "name count shape" line a tensor (layouts/layout_file.h)."""
    path = name if "/" in name else os.path.join(LAYOUTS, name + ".txt")
    names, counts = [], []
    with open(path) as f:
        for line in f:
            line = line.split("#")[0].split()
            if line:
                names.append(line[0])
                counts.append(int(line[1]))
    return names, counts


# ---- The trainer (a child process) ------------------------------------------

def trainer(args):
    """One trainer: imports, builds the model, says "ready", waits for "go"
    on stdin, then connects and takes one step, and prints its times."""
    import torch
    torch.set_num_threads(1)

    class Layout(torch.nn.Module):
        """A parameter of each size of the layout; its loss is coef times
        the sum of them all, so that every gradient element is coef."""

        def __init__(self, counts):
            super().__init__()
            self.params = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(c))
                                                 for c in counts)

        def forward(self, coef):
            return coef * sum(p.sum() for p in self.params)

    net = Layout(read_layout(args.layout)[1])
    params = net.params
    coef = torch.tensor(1.0 + 2.0 * args.node)  # node 0: gradients of 1, node 1: 3; average 2
    if args.trainer == "ddp":
        import datetime
        import torch.distributed as dist
    else:
        import gradsync.torch
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(1)
    t0 = time.perf_counter()
    if args.trainer == "ddp":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=args.node, world_size=NODES,
                                timeout=datetime.timedelta(seconds=STEP_TIMEOUT))
        t1 = time.perf_counter()
        model = torch.nn.parallel.DistributedDataParallel(net)
        t2 = time.perf_counter()
    else:
        model = net
        sync = gradsync.torch.GradSync(net, timeout=STEP_TIMEOUT)
        t1 = t2 = time.perf_counter()
    loss = model(coef)
    loss.backward()           # DDP: returns once its all-reduce is done
    if args.trainer != "ddp":
        sync.wait()
    t3 = time.perf_counter()
    for p in (params[0], params[len(params) - 1]):
        if not torch.all(p.grad == 2.0):
            sys.exit(f"node {args.node}: the first step's gradients are not the average")
    print(f"{(t3 - t0) * 1e3:.3f} {(t1 - t0) * 1e3:.3f} {(t2 - t1) * 1e3:.3f} "
          f"{(t3 - t2) * 1e3:.3f}", flush=True)
    if args.trainer == "ddp":
        dist.destroy_process_group()
    else:
        sync.close()


# ---- Processes, every one bounded and killed at the end ---------------------

def die_with_parent():
    """In a child, before exec: SIGKILL when this run's process ends, even
    killed itself (prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


class Procs:
    """The processes this run started: each in a session of its own, so
    that killing it by its id takes what it started with it."""

    def __init__(self):
        self.all = []

    def start(self, argv, log, **kw):
        p = subprocess.Popen(argv, stdout=kw.pop("stdout", log), stderr=log,
                             start_new_session=True, preexec_fn=die_with_parent, **kw)
        self.all.append(p)
        return p

    def kill(self, p, term_s=0):
        if p.poll() is None and term_s:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(term_s)
            except subprocess.TimeoutExpired:
                pass
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)

    def kill_all(self):
        for p in reversed(self.all):
            self.kill(p)


def read_line(p, deadline):
    """The next line of p's stdout, waiting until the monotonic deadline."""
    buf = b""
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    try:
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise RuntimeError("timed out waiting for a trainer")
            b = os.read(p.stdout.fileno(), 1)
            if not b:
                raise RuntimeError(f"a trainer exited with {p.wait(10)} (see its log)")
            buf += b
    finally:
        sel.close()
    return buf.decode().strip()


def wait_for(what, fn, timeout):
    deadline = time.monotonic() + timeout
    while True:
        r = fn()
        if r:
            return r
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ---- The daemons ------------------------------------------------------------

class Node:
    def __init__(self, procs, daemon, tmp, rank, port, linger):
        import gradsync
        self.gradsync = gradsync
        self.sock = os.path.join(tmp, f"n{rank}.sock")
        self.log = os.path.join(tmp, f"gradsyncd-{rank}.log")
        with open(self.log, "w") as log:
            self.proc = procs.start(
                [daemon, f"--socket={self.sock}", f"--node-address=127.0.0.{rank + 1}",
                 f"--node-port={port}", f"--job-linger={linger}", "--config=",
                 "--backend=host", "--max-jobs=32"], log, stdin=subprocess.DEVNULL)

    def control(self):
        return self.gradsync.Control(self.sock, timeout=DAEMON_TIMEOUT)

    def up(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"gradsyncd exited with {self.proc.returncode} (see {self.log})")
        if not os.path.exists(self.sock):
            return False
        try:
            with self.control() as c:
                return c.status()
        except self.gradsync.GradSyncError:
            return False

    def groups_built(self):
        with self.control() as c:
            for line in c.metrics().splitlines():
                if line.startswith("gradsync_groups_built_total "):
                    return int(float(line.split()[1]))
        raise RuntimeError("gradsync_groups_built_total missing from the metrics")

    def trainers_gone(self, job):
        """True once `job` has no trainer left on this node."""
        with self.control() as c:
            return all(j.trainers_connected == 0 for j in c.jobs() if j.job_id == job)


# ---- One repetition ------------------------------------------------------------

def repetition(mode, layout, job, procs, nodes, tmp, python):
    """Starts one trainer per node, lets both import and build the model,
    then starts them at once; returns each node's times in ms: in all, the
    connect (init_process_group; GradSync's constructor, registration
    included), DistributedDataParallel's constructor (0 for gradsync), the
    first step (forward, backward, the reduced gradients in place)."""
    port = free_port()
    trainers = []
    for n in range(NODES):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GRADSYNC_JOB", "GRADSYNC_NODE", "GRADSYNC_LOCAL",
                                    "MASTER_", "TORCHELASTIC", "SLURM_", "LOCAL_",
                                    "WORLD_SIZE", "GROUP_RANK", "RANK"))}
        env.update(GRADSYNC_JOB_ID=job, GRADSYNC_NODES=str(NODES), GRADSYNC_NODE_RANK=str(n),
                   GRADSYNC_LOCAL_SIZE="1", GRADSYNC_COORDINATOR="127.0.0.1",
                   GRADSYNC_SOCKET=nodes[n].sock, GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1")
        log = open(os.path.join(tmp, f"trainer-{layout}-{mode}-{n}.log"), "a")
        trainers.append(procs.start(
            [python, HERE, "--trainer", "gradsync" if mode != "ddp" else "ddp",
             "--layout", layout, "--node", str(n), "--port", str(port)],
            log, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env))
        log.close()
    try:
        for p in trainers:
            if read_line(p, time.monotonic() + GO_TIMEOUT) != "ready":
                raise RuntimeError("a trainer did not say ready")
        for p in trainers:
            p.stdin.write(b"go\n")
            p.stdin.flush()
        deadline = time.monotonic() + STEP_TIMEOUT
        times = [[float(x) for x in read_line(p, deadline).split()] for p in trainers]
        for p in trainers:
            rc = p.wait(max(1, deadline - time.monotonic()))
            if rc:
                raise RuntimeError(f"a trainer exited with {rc}")
        return times
    finally:
        for p in trainers:
            procs.kill(p)


# ---- The run ---------------------------------------------------------------------

def machine(isa):
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores online, {platform.system()} {platform.release()}, "
            f"kernels {isa}")


def run_layout(layout, args, procs, nodes, tmp, rows, built):
    python = sys.executable
    kept_job = f"kept-{layout}"
    new_jobs = 0

    def one(mode, rep):
        nonlocal new_jobs
        job = kept_job
        if mode == "new":
            new_jobs += 1
            job = f"new-{layout}-{new_jobs}"
        before = [n.groups_built() for n in nodes]
        times = repetition(mode, layout, job, procs, nodes, tmp, python)
        if mode != "ddp":
            # The job's trainers have gone on both nodes before anything else
            # starts: a kept job lingers from then on.
            for n in nodes:
                wait_for(f"job {job}'s trainers to leave", lambda: n.trainers_gone(job),
                         DAEMON_TIMEOUT)
        grew = [n.groups_built() - b for n, b in zip(nodes, before)]
        slow = max(range(NODES), key=lambda i: times[i][0])
        rows.append({"layout": layout, "mode": mode, "rep": rep,
                     "job": job if mode != "ddp" else "",
                     "node0_ms": times[0][0], "node1_ms": times[1][0],
                     "ms": times[slow][0], "connect_ms": times[slow][1],
                     "setup_ms": times[slow][2], "step_ms": times[slow][3],
                     "built0": grew[0], "built1": grew[1]})
        print(f"  {layout:9s} {mode:4s} rep {rep}: {times[slow][0]:9.1f} ms "
              f"(nodes {times[0][0]:.1f}, {times[1][0]:.1f}); groups built {grew}",
              flush=True)

    # Rep 0 of each mode is a warm-up, left out of the figures; kept's
    # warm-up is the job's first start, which builds its group. The modes
    # take turns in an order rotated every round, so that none always
    # follows the same one.
    for rep in range(args.repeat + 1):
        order = MODES[rep % 3:] + MODES[:rep % 3]
        for mode in order:
            one(mode, rep)
    counted = [r for r in rows if r["layout"] == layout and r["rep"] > 0]
    for mode in ("kept", "new"):
        built[(layout, mode)] = [sum(r[f"built{i}"] for r in counted if r["mode"] == mode)
                                 for i in range(NODES)]


def summarise(args, rows, built, head):
    out = list(head)
    out.append("")
    out.append(f"time from a (re)started trainer's connect to its first step done, 2 nodes x "
               f"1 trainer, the slower node; median of {args.repeat} repetitions each:")
    out.append(f"{'layout':10s} {'system':24s} {'median ms':>10s} {'min - max ms':>19s}  "
               f"{'x kept':>7s}  each")
    failures = []
    for layout in args.layouts.split(","):
        med = {}
        for mode in MODES:
            v = [r["ms"] for r in rows if r["layout"] == layout and r["mode"] == mode
                 and r["rep"] > 0]
            med[mode] = statistics.median(v)
            ratio = "" if mode == "kept" else f"{med[mode] / med['kept']:6.1f}x"
            out.append(f"{layout:10s} {NAMES[mode]:24s} {med[mode]:10.1f} "
                       f"{min(v):9.1f} - {max(v):7.1f}  {ratio:>7s}  "
                       f"[{', '.join(f'{x:.1f}' for x in v)}]")
    out.append("")
    out.append("where the slower node's time goes (medians, ms): connect is "
               "init_process_group for DDP and")
    out.append("the GradSync constructor for gradsync (its hello is answered once every "
               "node's daemon has joined);")
    out.append("setup is DistributedDataParallel(model); first step is forward, backward "
               "and the reduced gradients")
    out.append(f"{'layout':10s} {'system':24s} {'connect':>9s} {'setup':>9s} {'first step':>11s}")
    for layout in args.layouts.split(","):
        for mode in MODES:
            sel = [r for r in rows if r["layout"] == layout and r["mode"] == mode
                   and r["rep"] > 0]
            m = {k: statistics.median(r[k] for r in sel)
                 for k in ("connect_ms", "setup_ms", "step_ms")}
            out.append(f"{layout:10s} {NAMES[mode]:24s} {m['connect_ms']:9.1f} "
                       f"{m['setup_ms']:9.1f} {m['step_ms']:11.1f}")
    out.append("")
    out.append(f"groups built (gradsync_groups_built_total, node 0 and node 1) during the "
               f"{args.repeat} counted repetitions:")
    for layout in args.layouts.split(","):
        k, n = built[(layout, "kept")], built[(layout, "new")]
        out.append(f"  {layout:10s} kept: {k[0]}, {k[1]} (expected 0, 0); new: {n[0]}, {n[1]} "
                   f"(expected {args.repeat}, {args.repeat})")
        if k != [0] * NODES:
            failures.append(f"{layout}: the kept job built groups {k}")
        if n != [args.repeat] * NODES:
            failures.append(f"{layout}: the new jobs built groups {n}, not one each")
    return out, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", help="the gradsyncd to run")
    ap.add_argument("--out", help="folder for restart.csv and restart.txt")
    ap.add_argument("--layouts", default="resnet50,bert-base",
                    help="layouts/NAME.txt, comma-separated (default resnet50,bert-base)")
    ap.add_argument("--repeat", type=int, default=5, help="repetitions of each mode (default 5)")
    ap.add_argument("--linger", type=int, default=60, help="gradsyncd --job-linger (default 60)")
    ap.add_argument("--time-limit", type=int, default=900,
                    help="seconds for the whole run, after which it stops (default 900)")
    ap.add_argument("--trainer", choices=["gradsync", "ddp"], help=argparse.SUPPRESS)
    ap.add_argument("--layout", help=argparse.SUPPRESS)
    ap.add_argument("--node", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trainer:
        return trainer(args)
    if not args.daemon or not args.out or args.repeat < 1:
        ap.error("--daemon and --out are needed, and --repeat must be 1 or more")

    def stop(signum, frame):
        raise SystemExit(f"restart: stopped by signal {signum}")
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
        signal.signal(s, stop)
    signal.alarm(args.time_limit)

    os.makedirs(args.out, exist_ok=True)
    head = [f"command:  {' '.join(sys.argv)}",
            f"date:     {time.strftime('%Y-%m-%d %H:%M:%S %Z')}", "",
            f"load:     {os.getloadavg()[0]:.2f} before"]
    procs = Procs()
    rows, built = [], {}
    with tempfile.TemporaryDirectory(prefix="gs-restart-bench-") as tmp:
        try:
            port = free_port()
            nodes = [Node(procs, args.daemon, tmp, r, port, args.linger) for r in range(NODES)]
            status = [wait_for("gradsyncd to answer", n.up, DAEMON_TIMEOUT) for n in nodes]
            head[2] = f"machine:  {machine(status[0]['isa'])}"
            print("\n".join(head), flush=True)
            for layout in args.layouts.split(","):
                run_layout(layout, args, procs, nodes, tmp, rows, built)
        except BaseException:
            for name in sorted(os.listdir(tmp)):
                if name.endswith(".log"):
                    with open(os.path.join(tmp, name), errors="replace") as f:
                        text = f.read()[-3000:]
                    print(f"---- {name} (its end)\n{text}", file=sys.stderr)
            raise
        finally:
            signal.alarm(0)
            for p in procs.all[NODES:]:
                procs.kill(p)
            for p in procs.all[:NODES]:
                procs.kill(p, term_s=10)
    head[3] += f", {os.getloadavg()[0]:.2f} after (1-minute load average)"
    with open(os.path.join(args.out, "restart.csv"), "w") as f:
        keys = list(rows[0])
        f.write(",".join(keys) + "\n")
        for r in rows:
            f.write(",".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k])
                             for k in keys) + "\n")
    out, failures = summarise(args, rows, built, head)
    with open(os.path.join(args.out, "restart.txt"), "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out[len(head):]))
    if failures:
        raise SystemExit("restart: " + "; ".join(failures))


if __name__ == "__main__":
    main()
