"""The scale benchmark's runs (bench/scale.sh starts it after building):
per node count, a cluster of scripts/netcluster.sh and on it

  gloo      the all-reduce between nodes alone (gradsync-bench-gloo-algo,
            one rank per node): Gloo's ring, our recursive doubling and
            Rabenseifner, and with --no-rt Gloo's classic halving-doubling
            too, fp32, at several sizes;
  join      one gradsyncd per node, one verifying trainer per node on a
            small layout: from the trainers' start to the last one welcomed
            (the welcome comes once the node group is built), every element
            of 2 steps checked;
  step      gradsync-bench-trainer per node on the same small layout
            (threshold 65536 elements: several buckets): step time;
  tiny      64 tensors of 256 elements at threshold 1 (64 buckets of 512
            bytes in fp16): step time / 64 is the per-bucket latency;
  medium    4 tensors of 262144 elements at threshold 1 (4 buckets of
            512 KiB): the same.

step, tiny and medium run twice, on daemons that pick the algorithm by
the model (auto) and on daemons that run the ring for everything
(GRADSYNCD_GLOO_ALGO=ring, as before the model): the baseline of the same
run, and the ratio ring / auto is printed.

Step times are per step the slowest node's, then the median over steps.
Every process of a node runs under SCHED_FIFO priority 1 (chrt; --no-rt
to not): on this shared 2-core VM a woken thread otherwise waits for the
next scheduler tick (4 ms) whenever other work holds the cores, and every
message hop showed that 4 ms instead of the network's time. The kernel's
RT throttling still leaves the other work 5% of each core. Gloo's classic
halving-doubling cannot run so: built per call, its peer's device loop
busy-waits until the call's buffers are registered (Gloo's tcp
Pair::getBuffer), which under SCHED_FIFO starves the thread that would
register them, for good.
Writes gloo.csv (every call of every rank), daemon.csv (every step of
every rank), summary.csv, and prints the summary. Every process runs
under a timeout and every cluster is taken down on the way out.
"""
import argparse
import csv
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

NC = "scripts/netcluster.sh"
PORT = 29473
TINY = (64, 256)
MEDIUM = (4, 262144)


def sh(*argv, timeout=60):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)


RT = ["chrt", "-f", "1"]


def exec_argv(name, k, *cmd):
    return [NC, "exec", name, str(k), *RT, *cmd]


def spawn(argv, log, env=None):
    with open(log, "wb") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL)


def wait_all(procs, timeout, what):
    deadline = time.monotonic() + timeout
    for p, log in procs:
        try:
            rc = p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q, _ in procs:
                q.kill()
            raise SystemExit(f"scale: {what} overran {timeout} s; see {log}")
        if rc != 0:
            for q, _ in procs:
                q.kill()
            raise SystemExit(f"scale: {what} failed ({rc}):\n" + open(log).read()[-3000:])


def write_layout(path, rows):
    with open(path, "w") as f:
        f.writelines(f"{name} {count} {count}\n" for name, count in rows)


def cut_resnet(path, elements=300_000):
    rows, total = [], 0
    for line in open("layouts/resnet50.txt"):
        if line.startswith("#") or not line.strip():
            continue
        name, count = line.split()[:2]
        rows.append((name, int(count)))
        total += int(count)
        if total >= elements:
            break
    write_layout(path, rows)
    return total


def job_env(n, k, job, threshold):
    env = {key: v for key, v in os.environ.items() if not key.startswith("GRADSYNC_")}
    env.update(GRADSYNC_NODES=str(n), GRADSYNC_NODE_RANK=str(k),
               GRADSYNC_COORDINATOR="10.77.0.1", GRADSYNC_LOCAL_SIZE="1",
               GRADSYNC_JOB_ID=job, GRADSYNC_THRESHOLD=str(threshold))
    return env


class Run:
    def __init__(self, a, tmp):
        self.a, self.tmp = a, tmp
        self.bin = os.path.join(a.build, "bench")
        self.gloo_rows, self.daemon_rows, self.summary = [], [], []

    def note(self, n, measure, value, unit):
        self.summary.append((n, measure, round(value, 3), unit))
        print(f"  {n:2d} nodes  {measure:<28} {value:10.3f} {unit}", flush=True)

    # ---- the all-reduce alone
    def gloo(self, name, n):
        d = os.path.join(self.tmp, f"gloo-{n}")
        os.makedirs(os.path.join(d, "store"))
        procs = []
        for k in range(n):
            argv = exec_argv(name, k, os.path.join(self.bin, "gradsync-bench-gloo-algo"),
                             "--rank", str(k), "--size", str(n), "--store",
                             os.path.join(d, "store"), "--address", f"10.77.0.{k + 1}",
                             "--csv", os.path.join(d, f"r{k}.csv"), "--bytes", self.a.bytes,
                             "--calls", str(self.a.calls), "--warmup", "3", "--algos",
                             "ring,doubling,rabenseifner" if RT
                             else "ring,doubling,rabenseifner,halving-doubling")
            procs.append((spawn(["timeout", "-s", "KILL", "600", *argv],
                                os.path.join(d, f"r{k}.log")), os.path.join(d, f"r{k}.log")))
        wait_all(procs, 620, f"gloo at {n} nodes")
        calls = {}
        for k in range(n):
            for row in csv.reader(open(os.path.join(d, f"r{k}.csv"))):
                self.gloo_rows.append(row)
                calls.setdefault((row[0], int(row[3]), int(row[4])), []).append(float(row[5]))
        # Per call the slowest rank, then the median over calls.
        per = {}
        for (algo, b, _), us in calls.items():
            per.setdefault((algo, b), []).append(max(us))
        for (algo, b), v in sorted(per.items()):
            self.note(n, f"gloo {algo} {b} B", statistics.median(v), "us")

    # ---- daemons
    def daemons(self, name, n, d, algo):
        socks = [os.path.join(d, f"{algo}-n{k}.sock") for k in range(n)]
        procs = []
        env = dict(os.environ, GRADSYNCD_GLOO_ALGO=algo)
        port = PORT + (algo == "ring")
        for k in range(n):
            argv = exec_argv(name, k, os.path.join(self.a.build, "daemon", "gradsyncd"),
                             f"--socket={socks[k]}", f"--node-address=10.77.0.{k + 1}",
                             f"--node-port={port}", "--config=", "--backend=host",
                             "--join-timeout=120", "--peer-timeout=60",
                             "--log-level=warning")
            procs.append(spawn(["timeout", "-s", "KILL", "1800", *argv],
                               os.path.join(d, f"gradsyncd-{algo}-{k}.log"), env=env))
        deadline = time.monotonic() + 60
        while not all(os.path.exists(s) for s in socks):
            if time.monotonic() > deadline:
                raise SystemExit(f"scale: the daemons of {n} nodes did not start; logs in {d}")
            time.sleep(0.1)
        return socks, procs

    def join(self, name, n, d, socks, layout):
        t0 = time.monotonic()
        procs = []
        for k in range(n):
            log = os.path.join(d, f"join-{k}.log")
            argv = exec_argv(name, k, os.path.join(self.a.build, "tests", "trainer",
                                                   "gradsync-verifying-trainer"),
                             "--socket", socks[k], "--layout", layout, "--steps", "2")
            procs.append((spawn(["timeout", "-s", "KILL", "300", *argv], log,
                                env=job_env(n, k, "join", 65536)), log))
        welcomed = [None] * n
        deadline = t0 + 300
        while None in welcomed and time.monotonic() < deadline:
            for k, (p, log) in enumerate(procs):
                if welcomed[k] is None and re.search(r"^rank \d+ of", open(log).read(), re.M):
                    welcomed[k] = time.monotonic() - t0
                if welcomed[k] is None and p.poll() not in (None, 0):
                    raise SystemExit(f"scale: trainer {k} of {n} failed:\n" + open(log).read())
            time.sleep(0.01)
        wait_all(procs, 300, f"the verified job at {n} nodes")
        for k, (_, log) in enumerate(procs):
            if "OK: 2 steps verified" not in open(log).read():
                raise SystemExit(f"scale: trainer {k} of {n}: " + open(log).read())
        self.note(n, "join (last welcomed)", max(welcomed), "s")

    def steps(self, name, n, d, socks, algo, job, layout, threshold, per_bucket=None):
        procs = []
        job_name = job
        job = f"{algo}-{job}"
        for k in range(n):
            log = os.path.join(d, f"{job}-{k}.log")
            argv = exec_argv(name, k, os.path.join(self.bin, "gradsync-bench-trainer"),
                             "--socket", socks[k], "--layout", layout,
                             "--steps", str(self.a.steps), "--warmup", str(self.a.warmup),
                             "--csv", os.path.join(d, f"{job}-{k}.csv"))
            procs.append((spawn(["timeout", "-s", "KILL", "600", *argv], log,
                                env=job_env(n, k, f"{algo}-{job}", threshold)), log))
        wait_all(procs, 620, f"job {job} at {n} nodes ({algo})")
        by_step = {}
        for k in range(n):
            for row in csv.reader(open(os.path.join(d, f"{job}-{k}.csv"))):
                self.daemon_rows.append([n, job, *row])
                by_step.setdefault(int(row[1]), []).append(float(row[2]))
        ms = statistics.median(max(v) for v in by_step.values())
        self.note(n, f"{algo} {job_name} step", ms, "ms")
        if per_bucket:
            self.note(n, f"{algo} {job_name} per bucket", ms * 1e3 / per_bucket, "us")
        return ms

    def nodes(self, n):
        name = f"sc{os.getpid() % 100000}n{n}"
        d = os.path.join(self.tmp, f"daemons-{n}")
        os.makedirs(d)
        sh(NC, "down", name)
        sh(NC, "up", name, str(n), "--rate", self.a.rate, timeout=120)
        try:
            self.gloo(name, n)
            small = os.path.join(d, "small.txt")
            cut_resnet(small)
            tiny = os.path.join(d, "tiny.txt")
            write_layout(tiny, [(f"t{i}", TINY[1]) for i in range(TINY[0])])
            medium = os.path.join(d, "medium.txt")
            write_layout(medium, [(f"m{i}", MEDIUM[1]) for i in range(MEDIUM[0])])
            ms = {}
            for algo in ("auto", "ring"):
                socks, daemons = self.daemons(name, n, d, algo)
                try:
                    if algo == "auto":
                        self.join(name, n, d, socks, small)
                    for job, layout, threshold, per in (("step", small, 65536, None),
                                                        ("tiny", tiny, 1, TINY[0]),
                                                        ("medium", medium, 1, MEDIUM[0])):
                        ms[(algo, job)] = self.steps(name, n, d, socks, algo, job, layout,
                                                     threshold, per)
                finally:
                    for p in daemons:
                        p.send_signal(signal.SIGTERM)
                    for p in daemons:
                        try:
                            p.wait(timeout=20)
                        except subprocess.TimeoutExpired:
                            p.kill()
            for job in ("step", "tiny", "medium"):
                self.note(n, f"{job} ring / auto", ms[("ring", job)] / ms[("auto", job)], "x")
        finally:
            subprocess.run([NC, "down", name], capture_output=True, timeout=120)


def write_readme(a, r, cores):
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write("# gradsync at several node counts on a cluster on one machine\n\n")
        f.write(f"Written by `bench/scale.sh` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                f"{cores} cores, {os.uname().sysname} {os.uname().release}, load "
                f"{' '.join(open('/proc/loadavg').read().split()[:3])} at the end), "
                f"`{' '.join(sys.argv[1:])}`; nodes at {a.rate}, "
                f"{'normal priority' if a.no_rt else 'SCHED_FIFO 1'}. `gloo.csv`: every call "
                "of every rank of the all-reduce alone; `daemon.csv`: every step of every "
                "rank of the daemons' jobs (auto: the model's pick; ring: all-ring); "
                "`summary.csv`: the medians below; `model.txt` and `model.svg`: "
                "`bench/model.py`'s fit (see doc/scaling.md).\n\n```\n")
        for n, measure, value, unit in r.summary:
            if n:
                f.write(f"{n:3d} nodes  {measure:<28} {value:12.3f} {unit}\n")
        f.write("```\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("GRADSYNC_BUILD", "build"))
    ap.add_argument("--nodes", default="2,4,8,16")
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--bytes", default="4,1024,16384,65536,262144,1048576,4194304")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="bench/results/scale")
    ap.add_argument("--no-rt", action="store_true",
                    help="run the nodes' processes at normal priority")
    a = ap.parse_args()
    # A signal unwinds like an error, through the finally blocks that stop
    # the nodes' processes and take their cluster down.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    if a.no_rt:
        RT.clear()
    counts = [int(x) for x in a.nodes.split(",")]
    cores = len(os.sched_getaffinity(0))
    print(f"scale: nodes {counts} as network namespaces at {a.rate}, on {cores} cores: "
          f"node K runs on core K % {cores}, so {max(counts)} nodes share {cores} cores "
          f"({-(-max(counts) // cores)} a core) and what grows with the node count is "
          f"CPU sharing as much as the network; the machine is shared with other work, "
          f"so the figures are noisy; the nodes' processes run "
          f"{'at normal priority' if a.no_rt else 'under SCHED_FIFO 1 (chrt)'}.", flush=True)
    with tempfile.TemporaryDirectory(prefix="gradsync-scale-") as tmp:
        r = Run(a, tmp)
        r.summary.append((0, "cores", cores, "cores the nodes share"))
        for n in counts:
            r.nodes(n)
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "gloo.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["algo", "nodes", "rank", "bytes", "call", "us"])
            w.writerows(r.gloo_rows)
        with open(os.path.join(a.out, "daemon.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["nodes", "job", "rank", "step", "ms", "daemon_ms", "wire_bytes"])
            w.writerows(r.daemon_rows)
        with open(os.path.join(a.out, "summary.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["nodes", "measure", "value", "unit"])
            w.writerows(r.summary)
        write_readme(a, r, cores)
    print(f"scale: wrote {a.out}/gloo.csv, daemon.csv, summary.csv; "
          f"fit with: python3 bench/model.py {a.out}")


if __name__ == "__main__":
    sys.exit(main())
