"""Eight gradsyncd, one in each of eight network namespaces of
scripts/netcluster.sh (the nodes share this machine's cores), and three
jobs of 8 nodes x 1 trainer on a small layout (ResNet-50's first tensors,
cut to about 400K elements), their buckets in each of the bands the
daemons log (recursive doubling, Rabenseifner, Gloo's ring): every element
of every step checked by the verifying trainers against their own fp64
reference of all eight ranks' inputs. The join time (trainers started to the last
one welcomed) and the step time (the trainers' medians) are printed; they
are a busy machine's, not a benchmark's (bench/scale.sh is that). Skipped
(77) where namespaces cannot be made or without Gloo.

Paths come from meson: GS_DAEMON, GS_TRAINER, GS_CTL, GS_LAYOUTS,
GS_HAVE_GLOO, GS_SOURCE_ROOT.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("GS_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "tests", "ops"))
from opslib import LAUNCH_VARS, Skip, check, daemon_env, run, spawn, wait_for  # noqa: E402
from cluster import Cluster  # noqa: E402

DAEMON = os.environ.get("GS_DAEMON", "")
TRAINER = os.environ.get("GS_TRAINER", "")
CTL = os.environ.get("GS_CTL", "")
FULL_LAYOUT = os.path.join(os.environ.get("GS_LAYOUTS", ""), "resnet50.txt")
NODES = 8
PORT = 29471
STEPS = 4
ELEMENTS = 300_000  # the cut layout's size, about
# Bucket thresholds (elements), one job each: 4096 makes mostly small fp16
# buckets (recursive doubling at 8 nodes), 65536 buckets of 128 KiB
# (Rabenseifner), 393216 one of more than 768 KiB (Gloo's ring).
THRESHOLDS = {"eight-small": 4096, "eight": 65536, "eight-ring": 393216}
JOIN_LIMIT = 40     # s, for all eight to be welcomed on 2 shared cores


def text(path):
    with open(path, errors="replace") as f:
        return f.read()


def cut_layout(dst):
    """ResNet-50's tensors in order until ELEMENTS is passed, written to dst.
    Returns (tensors, elements)."""
    rows, total = [], 0
    for line in open(FULL_LAYOUT):
        if line.startswith("#") or not line.strip():
            continue
        rows.append(line)
        total += int(line.split()[1])
        if total >= ELEMENTS:
            break
    with open(dst, "w") as f:
        f.write(f"# resnet50's first {len(rows)} tensors ({total} elements)\n")
        f.writelines(rows)
    return len(rows), total


def status(sock):
    try:
        p = subprocess.run([CTL, "--socket", sock, "--timeout", "2000", "status", "--json"],
                           capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(p.stdout) if p.returncode == 0 else None


def start_daemons(c, tmp):
    socks = [os.path.join(tmp, f"n{k}.sock") for k in range(NODES)]
    daemons = []
    for k in range(NODES):
        argv = c.argv(k, DAEMON, f"--socket={socks[k]}", f"--node-address=10.77.0.{k + 1}",
                      f"--node-port={PORT}", "--config=", "--peer-timeout=10")
        daemons.append(spawn(argv, os.path.join(tmp, f"daemon-{k}.log"), env=daemon_env()))
    for k in range(NODES):
        wait_for(lambda: status(socks[k]), 30, f"node {k}'s daemon")
    return socks, daemons


def start_trainer(c, tmp, socks, layout, k, job):
    env = {key: v for key, v in os.environ.items() if key not in LAUNCH_VARS}
    env.update(GRADSYNC_NODES=str(NODES), GRADSYNC_NODE_RANK=str(k),
               GRADSYNC_COORDINATOR="10.77.0.1", GRADSYNC_LOCAL_SIZE="1",
               GRADSYNC_JOB_ID=job, GRADSYNC_THRESHOLD=str(THRESHOLDS[job]))
    log = os.path.join(tmp, f"{job}-trainer-{k}.log")
    argv = c.argv(k, TRAINER, "--socket", socks[k], "--layout", layout,
                  "--steps", str(STEPS))
    return spawn(argv, log, env=env), log


def test_eight_nodes():
    if not (DAEMON and TRAINER and CTL):
        raise Skip("GS_DAEMON, GS_TRAINER and GS_CTL are meson's: run it through meson test")
    if os.environ.get("GS_HAVE_GLOO") != "1":
        raise Skip("several nodes need Gloo")
    with Cluster("e", NODES, "--rate", "1gbit") as c, \
            tempfile.TemporaryDirectory(prefix="gsnc-") as tmp:
        os.chmod(tmp, 0o755)
        layout = os.path.join(tmp, "resnet50-cut.txt")
        tensors, elements = cut_layout(layout)
        socks, daemons = start_daemons(c, tmp)
        try:
            for job in THRESHOLDS:
                run_job(c, tmp, socks, layout, tensors, elements, job)
            # Each node says how it sums: the model's bands for 8 nodes,
            # which the jobs' buckets fall in one each (a bucket closes once
            # it passes its threshold: one of "eight-ring"'s has more than
            # 393216 fp16 elements, and "eight-small"'s first one, of the
            # first 4096-element tensors, is doubling's).
            for k in range(NODES):
                m = re.search(r"the group of 8 nodes sums buckets of up to (\d+) bytes by "
                              r"recursive doubling, up to (\d+) by Rabenseifner",
                              text(os.path.join(tmp, f"daemon-{k}.log")))
                check(m, f"node {k}'s daemon does not log its pick")
                d, r = int(m.group(1)), int(m.group(2))
                check(2 * THRESHOLDS["eight-small"] <= d < 2 * THRESHOLDS["eight"] <= r <
                      2 * THRESHOLDS["eight-ring"],
                      f"node {k} sums by doubling up to {d} bytes, Rabenseifner up to {r}: "
                      f"the jobs' buckets do not fall one in each band")
            print(m.group(0))
            for d in daemons:
                d.send_signal(signal.SIGTERM)
            for k, d in enumerate(daemons):
                check(d.wait(timeout=20) == 0, f"node {k}'s daemon exited {d.returncode}")
        except BaseException:
            for k in range(NODES):
                print(f"--- node {k}'s daemon:\n"
                      + text(os.path.join(tmp, f"daemon-{k}.log"))[-3000:])
            raise


def run_job(c, tmp, socks, layout, tensors, elements, job):
    t0 = time.monotonic()
    trainers = [start_trainer(c, tmp, socks, layout, k, job) for k in range(NODES)]
    welcomed = [None] * NODES

    def all_welcomed():
        for k, (p, log) in enumerate(trainers):
            check(p.poll() is None or p.returncode == 0,
                  f"node {k}'s trainer exited {p.returncode}: {text(log)}")
            if welcomed[k] is None and re.search(r"^rank \d+ of 8 ", text(log), re.M):
                welcomed[k] = time.monotonic() - t0
        return all(w is not None for w in welcomed)

    wait_for(all_welcomed, JOIN_LIMIT, "all eight trainers to be welcomed", step=0.02)
    join = max(welcomed)
    medians = []
    for k, (p, log) in enumerate(trainers):
        rc = p.wait(timeout=60)
        out = text(log)
        m = re.search(rf"^OK: {STEPS} steps verified, median step ([0-9.]+) ms$", out, re.M)
        check(rc == 0 and m, f"node {k}'s trainer exited {rc}: {out}")
        # The trainer's world is the job's: eight ranks, this one its node's.
        check(re.search(rf"^rank {k} of 8 \(node {k}, local 0 of 1\): {tensors} tensors, "
                        rf"{elements} elements", out, re.M),
              f"node {k}'s trainer saw another job: {out.splitlines()[0]}")
        medians.append(float(m.group(1)))
    print(text(trainers[0][1]).strip())
    print(f"8 nodes (sharing {os.cpu_count()} cores), {tensors} tensors, {elements} elements, "
          f"threshold {THRESHOLDS[job]}: every element of {STEPS} steps right on every node")
    print(f"join: all 8 trainers welcomed {join:.2f} s after they started "
          f"(first {min(welcomed):.2f} s)")
    print("step: median per node " + " ".join(f"{x:.1f}" for x in medians) + " ms")


if __name__ == "__main__":
    run([test_eight_nodes])
