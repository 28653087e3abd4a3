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
import os
import re
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("GS_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "tests", "ops"))
from opslib import Skip, check, run, wait_for  # noqa: E402
from cluster import Cluster  # noqa: E402
from nodes import CTL, DAEMON, TRAINER, Nodes, text  # noqa: E402

FULL_LAYOUT = os.path.join(os.environ.get("GS_LAYOUTS", ""), "resnet50.txt")
NODES = 8
STEPS = 4
ELEMENTS = 300_000  # the cut layout's size, about
# Bucket thresholds (elements), one job each: 4096 makes mostly small fp16
# buckets (recursive doubling at 8 nodes), 65536 buckets of 128 KiB
# (Rabenseifner), 393216 one of more than 768 KiB (Gloo's ring).
THRESHOLDS = {"eight-small": 4096, "eight": 65536, "eight-ring": 393216}
JOIN_LIMIT = 40     # s, for all eight to be welcomed on 2 shared cores


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
        n = Nodes(c, tmp, NODES, "--peer-timeout=10")
        try:
            for job in THRESHOLDS:
                run_job(n, layout, tensors, elements, job)
            # Each node says how it sums: the model's bands for 8 nodes,
            # which the jobs' buckets fall in one each (a bucket closes once
            # it passes its threshold: one of "eight-ring"'s has more than
            # 393216 fp16 elements, and "eight-small"'s first one, of the
            # first 4096-element tensors, is doubling's).
            for k in range(NODES):
                m = re.search(r"the group of 8 nodes sums buckets of up to (\d+) bytes by "
                              r"recursive doubling, up to (\d+) by Rabenseifner",
                              text(n.log(k)))
                check(m, f"node {k}'s daemon does not log its pick")
                d, r = int(m.group(1)), int(m.group(2))
                check(2 * THRESHOLDS["eight-small"] <= d < 2 * THRESHOLDS["eight"] <= r <
                      2 * THRESHOLDS["eight-ring"],
                      f"node {k} sums by doubling up to {d} bytes, Rabenseifner up to {r}: "
                      f"the jobs' buckets do not fall one in each band")
            print(m.group(0))
            for d in n.daemons:
                d.send_signal(signal.SIGTERM)
            for k, d in enumerate(n.daemons):
                check(d.wait(timeout=20) == 0, f"node {k}'s daemon exited {d.returncode}")
        except BaseException:
            n.dump()
            raise


def run_job(n, layout, tensors, elements, job):
    t0 = time.monotonic()
    threshold = {"GRADSYNC_THRESHOLD": str(THRESHOLDS[job])}
    trainers = [n.trainer(k, job, layout, STEPS, settings=threshold) for k in range(NODES)]
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
