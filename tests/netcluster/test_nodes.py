"""Two gradsyncd in two network namespaces of scripts/netcluster.sh, each
reaching the other over its shaped link: a job of 2 nodes x 1 trainer whose
every element the verifying trainers check, then node 1's link cut in the
middle of a step: node 0's trainer has the step aborted, naming node 1,
within --peer-timeout and a slack, node 0's daemon answers status
throughout, and both daemons then stop cleanly. Then, on a slow link, the
cut comes in the middle of a bucket of several pipeline slices, some of
them all-reduced: each trainer finds every tensor its own, bit for bit
(none half reduced), and both daemons stop cleanly; and the same with node
1's daemon SIGKILLed instead, node 0's trainer checked and node 0's daemon
stopping cleanly. Last, with the daemons on two CPUs (where buckets
overlap), the cut comes while node 0
exchanges bucket 1 of four with bucket 2 packed behind it: bucket 0 is
reduced on both nodes, the others their trainers' own. Skipped (77) where
namespaces cannot be made or without Gloo.

Paths come from meson: GS_DAEMON, GS_TRAINER, GS_CTL, GS_LAYOUTS,
GS_HAVE_GLOO, GS_SOURCE_ROOT.
"""
import os
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("GS_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "tests", "ops"))
from opslib import Skip, check, run, wait_for  # noqa: E402
from cluster import Cluster  # noqa: E402
from nodes import CTL, DAEMON, TRAINER, Nodes, job_status, metric, status, text  # noqa: E402

LAYOUT = os.path.join(os.environ.get("GS_LAYOUTS", ""), "resnet50.txt")
PEER_TIMEOUT = 2
SLACK = 3


def on_cluster(suffix, rate, body, cpus=None):
    """body(cluster, nodes, tmp) with a daemon on each node of a cluster of
    two at `rate` (on `cpus`, as Nodes takes them), their logs shown when
    it fails."""
    if not (DAEMON and TRAINER and CTL):
        raise Skip("GS_DAEMON, GS_TRAINER and GS_CTL are meson's: run it through meson test")
    if os.environ.get("GS_HAVE_GLOO") != "1":
        raise Skip("several nodes need Gloo")
    with Cluster(suffix, 2, "--rate", rate) as c, \
            tempfile.TemporaryDirectory(prefix="gsnc-") as tmp:
        os.chmod(tmp, 0o755)
        n = Nodes(c, tmp, 2, f"--peer-timeout={PEER_TIMEOUT}", cpus=cpus)
        try:
            body(c, n, tmp)
        except BaseException:
            n.dump()  # the daemons' side, before tmp goes
            raise


def test_job_and_link_cut():
    on_cluster("g", "1gbit", lambda c, n, tmp: run_job_and_cut(c, n, 5))


def test_link_cut_in_a_vote():
    # Node 1's trainer marks nothing of step 2: node 0 waits in bucket 0's
    # head, whose wait for the other nodes' vote may last --step-timeout
    # (180 s) plus --peer-timeout; the cut must end it at node 1's loss.
    on_cluster("h", "1gbit", lambda c, n, tmp: run_job_and_cut(c, n, 0))


def cut_link(c, k):
    c.ip(k, "link", "set", "eth0", "down")


def stop_cleanly(n, trainers):
    """Both daemons stop cleanly (under the sanitizers, with their checks),
    node 1's with its link still down."""
    for p in trainers:
        p.kill()
        p.wait(timeout=10)
    for d in n.daemons:
        d.send_signal(signal.SIGTERM)
    for k, d in enumerate(n.daemons):
        check(d.wait(timeout=20) == 0, f"node {k}'s daemon exited {d.returncode}")


def run_job_and_cut(c, n, marks):
    # A job of two nodes, every element of two steps checked.
    t = [n.trainer(k, "verified", LAYOUT, 2) for k in range(2)]
    for k, (p, log) in enumerate(t):
        rc = p.wait(timeout=60)
        check(rc == 0 and "OK: 2 steps verified" in text(log),
              f"node {k}'s trainer exited {rc}: {text(log)}")
    print(text(t[0][1]).strip())

    # Another job: node 1's trainer stops in step 2 with `marks` tensors
    # marked, so that node 0's step 2 is in flight (it waits for node 1)
    # when node 1's link goes down.
    p0, log0 = n.trainer(0, "cut", LAYOUT, 2, "--expect-abort-at", "2")
    p1, log1 = n.trainer(1, "cut", LAYOUT, 3, "--pause-at-step", "2", "--pause-after",
                         str(marks))
    wait_for(lambda: "PAUSED in step 2" in text(log1), 30, "node 1's trainer to pause")
    # Node 0's trainer's marks in: its buckets launched, the first of them
    # waiting for node 1 (in flight until the step ends).
    wait_for(lambda: (job_status(n.socks[0], "cut") or {}).get("current_step") == 2
             and job_status(n.socks[0], "cut")["buckets_in_flight"] > 0,
             30, "node 0's buckets of step 2 launched")
    cut = time.monotonic()
    cut_link(c, 1)
    slowest = 0.0
    while "ABORTED step 2 as expected" not in text(log0):
        check(time.monotonic() - cut < PEER_TIMEOUT + SLACK,
              f"no abort {PEER_TIMEOUT + SLACK} s after the cut: {text(log0)}")
        t0 = time.monotonic()
        check(status(n.socks[0]) is not None, "node 0's daemon did not answer status")
        slowest = max(slowest, time.monotonic() - t0)
        time.sleep(0.1)
    took = time.monotonic() - cut
    print(f"node 0's step aborted {took:.2f} s after the cut (--peer-timeout "
          f"{PEER_TIMEOUT} s); status answered within {slowest:.2f} s throughout")
    line = next(x for x in text(log0).splitlines() if x.startswith("ABORTED"))
    print(line)
    check("node 1 went away" in line, f"the abort does not name node 1: {line}")
    check(p0.wait(timeout=30) == 0, f"node 0's trainer: {text(log0)}")
    check(n.daemons[0].poll() is None, "node 0's daemon exited")
    peers = wait_for(lambda: (job_status(n.socks[0], "cut") or {}).get("peers"), 5,
                     "node 0's status of the job")
    check(peers[1]["state"] == "lost", f"node 0 shows node 1 as {peers[1]}")

    stop_cleanly(n, [p1])


# The host backend's all-reduce of a bucket goes in a head of HEAD elements
# and then slices of SLICE (where node 0 has two CPUs), each followed by a
# status of STATUS elements (node protocol 7).
HEAD, SLICE, STATUS = 16384, 1048576, 9
# This layout is one bucket of three tensors (the third, in backpropagation
# order, passes the threshold): 3000000 elements, a head and 3 slices.
PIPE_TENSORS = [1000000, 1000000, 1000000]
PIPE_RATE = "25mbit"  # a full slice (2 MiB of fp16) takes about 0.7 s


def wire_bytes(elements, members):
    """fp16 bytes node 0 sends for a bucket of `members` tensors on two
    nodes (a ring sends one buffer): every slice's elements and its status,
    and the head's produced count per member."""
    slices = 1 + -(-(elements - HEAD) // SLICE)
    return (elements + STATUS * slices + members) * 2


def every_cpu():
    """Node 0 offers pipeline slices, and a daemon overlaps buckets, only
    where it may use two CPUs: the daemons get every CPU rather than their
    node's one."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise Skip("the pipeline needs the daemons on two CPUs; this machine lends one")
    return ",".join(map(str, cpus))


def mid_pipeline(suffix, lose):
    on_cluster(suffix, PIPE_RATE, lambda c, n, tmp: run_mid_pipeline(c, n, tmp, lose),
               every_cpu())


def test_link_cut_mid_pipeline():
    mid_pipeline("p", "cut")


def test_peer_killed_mid_pipeline():
    mid_pipeline("q", "kill")


def aborted_with(trainers, reduced, tensors):
    """Each trainer (process, log) had step 2 aborted with `reduced` of
    its `tensors` reduced; it checked each other one is its own, bit for
    bit."""
    for k, (p, log) in enumerate(trainers):
        rc = p.wait(timeout=60)
        out = text(log)
        print(out.strip())
        check(rc == 0 and "ABORTED step 2 as expected" in out,
              f"node {k}'s trainer exited {rc}: {out}")
        check(f"{reduced} of {tensors} tensors reduced" in out,
              f"node {k}'s trainer: not {reduced} tensors reduced after the cut: {out}")


def run_mid_pipeline(c, n, tmp, lose):
    """Node 1 lost while node 0 is in the middle of a bucket's pipeline: its
    link cut ("cut"), or its daemon SIGKILLed ("kill")."""
    layout = os.path.join(tmp, "pipeline.txt")
    with open(layout, "w") as f:
        f.write("# one bucket of many pipeline slices\n")
        for i, count in enumerate(PIPE_TENSORS):
            f.write(f"t{i} {count} {count}\n")
    bucket0 = wire_bytes(sum(PIPE_TENSORS), len(PIPE_TENSORS))
    step = bucket0
    full = (SLICE + STATUS) * 2  # bytes of one slice after the head

    # Step 1 whole; step 2 cut while node 0 sends the second of the
    # bucket's 3 slices after its head (the first and the head are sent).
    t = [n.trainer(k, "pipe", layout, 2, "--expect-abort-at", "2") for k in range(2)]
    def mid_bucket():
        js = job_status(n.socks[0], "pipe") or {}
        sent = js.get("internode_bytes", 0) - step
        check(sent < 2 * full, f"node 0 sent {sent} bytes of step 2 unseen: the status "
              "came too late to cut in the middle of bucket 0")
        return sent >= full and js.get("current_step") == 2
    wait_for(mid_bucket, 60, "node 0 in the middle of step 2's bucket")
    if lose == "cut":
        cut_link(c, 1)
    else:
        n.daemons[1].kill()
        n.daemons[1].wait(timeout=10)
    at_cut = job_status(n.socks[0], "pipe")["internode_bytes"] - step
    # Node 1's trainer loses its daemon with it; node 0's is checked alone.
    # The bucket was cut: none of its tensors reduced.
    aborted_with(t if lose == "cut" else t[:1], 0, len(PIPE_TENSORS))
    sent = job_status(n.socks[0], "pipe")["internode_bytes"] - step
    print(f"node 0 had sent {at_cut} bytes of step 2's bucket 0 at the cut and {sent} "
          f"in all, of {bucket0} ({full} a slice)")
    check(full <= at_cut <= sent < bucket0,
          f"not cut in the middle of bucket 0: {at_cut}, then {sent} of {bucket0} bytes")
    if lose == "kill":
        t[1][0].kill()
        t[1][0].wait(timeout=10)
        n.daemons = n.daemons[:1]
    stop_cleanly(n, [])


# Four buckets of one tensor each (the threshold is below a tensor), each a
# head and one slice: all queued at once, so each after the first is
# packed while the one before it is exchanged (where the daemon may use two
# CPUs).
OVERLAP_TENSORS = [500000] * 4
OVERLAP_SETTINGS = {"GRADSYNC_THRESHOLD": "400000"}


def test_link_cut_between_overlapped_buckets():
    on_cluster("o", PIPE_RATE, run_cut_between_buckets, every_cpu())


def run_cut_between_buckets(c, n, tmp):
    """Node 1's link cut while node 0 exchanges bucket 1 with bucket 2
    packed behind it: bucket 0 is reduced on both nodes, buckets 1 to 3
    hold each trainer's own gradients, bit for bit."""
    layout = os.path.join(tmp, "overlap.txt")
    with open(layout, "w") as f:
        f.write("# four buckets, packed one behind the other\n")
        for i, count in enumerate(OVERLAP_TENSORS):
            f.write(f"t{i} {count} {count}\n")
    bucket = wire_bytes(OVERLAP_TENSORS[0], 1)  # one tensor a bucket
    step = bucket * len(OVERLAP_TENSORS)

    t = [n.trainer(k, "ovl", layout, 2, "--expect-abort-at", "2", settings=OVERLAP_SETTINGS)
         for k in range(2)]
    def in_bucket_1():
        js = job_status(n.socks[0], "ovl") or {}
        sent = js.get("internode_bytes", 0) - step
        check(sent < 2 * bucket, f"node 0 sent {sent} bytes of step 2 unseen: the status "
              "came too late to cut in the middle of bucket 1")
        # Bucket 0 and bucket 1's head through: in the rest of bucket 1.
        return sent >= bucket + 2 * (HEAD + STATUS) and js.get("current_step") == 2
    wait_for(in_bucket_1, 60, "node 0 in the middle of step 2's bucket 1")
    cut_link(c, 1)
    overlapped = metric(n.socks[0], "gradsync_buckets_overlapped_total", "ovl")
    at_cut = job_status(n.socks[0], "ovl")["internode_bytes"] - step
    # Step 1 packed buckets 1 to 3 early; step 2 bucket 1, and bucket 2
    # once bucket 1's exchange had begun.
    check(overlapped == 2 * (len(OVERLAP_TENSORS) - 1) - 1,
          f"node 0 packed {overlapped} buckets early by the cut, not step 1's 3 and step 2's 2")
    # Bucket 0 (the last tensor, first in backpropagation) reduced;
    # bucket 2, packed, and bucket 3 never written.
    aborted_with(t, 1, len(OVERLAP_TENSORS))
    sent = job_status(n.socks[0], "ovl")["internode_bytes"] - step
    print(f"node 0 had sent {at_cut} bytes of step 2 at the cut and {sent} in all "
          f"({bucket} a bucket); {overlapped:.0f} buckets packed early by then")
    check(bucket < at_cut <= sent < 2 * bucket,
          f"not cut in the middle of bucket 1: {at_cut}, then {sent} bytes")
    stop_cleanly(n, [])


if __name__ == "__main__":
    run([test_job_and_link_cut, test_link_cut_in_a_vote, test_link_cut_mid_pipeline,
         test_peer_killed_mid_pipeline, test_link_cut_between_overlapped_buckets])
