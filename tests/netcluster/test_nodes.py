"""Two gradsyncd in two network namespaces of scripts/netcluster.sh, each
reaching the other over its shaped link: a job of 2 nodes x 1 trainer whose
every element the verifying trainers check, then node 1's link cut in the
middle of a step: node 0's trainer has the step aborted, naming node 1,
within --peer-timeout and a slack, node 0's daemon answers status
throughout, and both daemons then stop cleanly. Skipped (77) where namespaces cannot be made or without Gloo.

Paths come from meson: GS_DAEMON, GS_TRAINER, GS_CTL, GS_LAYOUTS,
GS_HAVE_GLOO, GS_SOURCE_ROOT.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("GS_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "tests", "ops"))
from opslib import Skip, check, run, wait_for  # noqa: E402
from cluster import Cluster  # noqa: E402
from nodes import CTL, DAEMON, TRAINER, Nodes, job_status, status, text  # noqa: E402

LAYOUT = os.path.join(os.environ.get("GS_LAYOUTS", ""), "resnet50.txt")
PEER_TIMEOUT = 2
SLACK = 3


def test_job_and_link_cut():
    if not (DAEMON and TRAINER and CTL):
        raise Skip("GS_DAEMON, GS_TRAINER and GS_CTL are meson's: run it through meson test")
    if os.environ.get("GS_HAVE_GLOO") != "1":
        raise Skip("several nodes need Gloo")
    with Cluster("g", 2, "--rate", "1gbit") as c, \
            tempfile.TemporaryDirectory(prefix="gsnc-") as tmp:
        os.chmod(tmp, 0o755)
        n = Nodes(c, tmp, 2, f"--peer-timeout={PEER_TIMEOUT}")
        try:
            run_job_and_cut(c, n)
        except BaseException:
            n.dump()  # the daemons' side, before tmp goes
            raise


def run_job_and_cut(c, n):
    # A job of two nodes, every element of two steps checked.
    t = [n.trainer(k, "verified", LAYOUT, 2) for k in range(2)]
    for k, (p, log) in enumerate(t):
        rc = p.wait(timeout=60)
        check(rc == 0 and "OK: 2 steps verified" in text(log),
              f"node {k}'s trainer exited {rc}: {text(log)}")
    print(text(t[0][1]).strip())

    # Another job: node 1's trainer stops in step 2 with a few tensors
    # marked, so that node 0's step 2 is in flight (it waits for node 1)
    # when node 1's link goes down.
    p0, log0 = n.trainer(0, "cut", LAYOUT, 2, "--expect-abort-at", "2")
    p1, log1 = n.trainer(1, "cut", LAYOUT, 3, "--pause-at-step", "2", "--pause-after", "5")
    wait_for(lambda: "PAUSED in step 2" in text(log1), 30, "node 1's trainer to pause")
    wait_for(lambda: (job_status(n.socks[0], "cut") or {}).get("current_step") == 2
             and job_status(n.socks[0], "cut")["state"] == "in step",
             30, "node 0 in step 2")
    cut = time.monotonic()
    subprocess.run(["ip", "-n", f"gsnc-{c.name}-n1", "link", "set", "eth0", "down"],
                   check=True, timeout=10)
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

    # Both daemons stop cleanly (under the sanitizers, with their checks),
    # node 1's with its link still down.
    p1.kill()
    p1.wait(timeout=10)
    for d in n.daemons:
        d.send_signal(signal.SIGTERM)
    for k, d in enumerate(n.daemons):
        check(d.wait(timeout=20) == 0, f"node {k}'s daemon exited {d.returncode}")


if __name__ == "__main__":
    run([test_job_and_link_cut])
