"""Nodes that vanish from the network, on scripts/netcluster.sh: a link
taken down with `ip link set eth0 down` inside a node's namespace, where
nothing closes a connection and no packet says goodbye, which a killed
process or a frozen proxy on loopback only imitates. Two daemons, a job of
2 nodes x 1 trainer whose group outlives its trainers (--job-linger), and
every step's every element checked by the verifying trainers:

  partition_heals       node 1's link down between steps: both sides take
                        the other as gone within --peer-timeout and a
                        slack; the link back, node 1 joins again and the
                        next step is right.
  one_way_partition     node 1 hears node 0 but cannot answer (an
                        unreachable route): node 1 takes node 0 as gone,
                        by TCP's timeout or its ping timer, and says
                        why; the route gone, it joins again.
  node_vanishes         node 1's daemon killed while its link is down (no
                        FIN reaches node 0); a new node-1 daemon, the link
                        back, is taken as node 1, not as a second claim.
  link_down_at_join     a new job whose node 1 cannot reach node 0: its
                        trainer is refused within --join-timeout, naming
                        the coordinator, and node 1's daemon serves on;
                        the link back, the job runs.

Skipped (77) where namespaces cannot be made or without Gloo."""
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
from nodes import CTL, DAEMON, TRAINER, Nodes, job_status, peer_state, status, text  # noqa: E402

PEER_TIMEOUT = 2
COORDINATOR = "10.77.0.1"  # node 0's address on the cluster's bridge
JOIN_TIMEOUT = 6
SLACK = 3
FLAGS = (f"--peer-timeout={PEER_TIMEOUT}", f"--join-timeout={JOIN_TIMEOUT}",
         "--job-linger=120")


def link(c, node, state):
    c.ip(node, "link", "set", "eth0", state)


def write_layout(tmp):
    """A small layout of our own (three tensors), so that a step is quick."""
    path = os.path.join(tmp, "small.txt")
    with open(path, "w") as f:
        f.write("first 1000\nmiddle 300000\nlast 5000\n")
    return path


def run_step(n, job, layout):
    """One step of `job` with a trainer on each node; both must pass."""
    t = [n.trainer(k, job, layout, 1) for k in range(n.count)]
    for k, (p, log) in enumerate(t):
        rc = p.wait(timeout=60)
        check(rc == 0 and "OK: 1 steps verified" in text(log),
              f"node {k}'s trainer of {job} exited {rc}: {text(log)}")


def timed(pred, limit, what, n):
    """Seconds until pred() holds, at most `limit`; node 0's daemon must
    answer status all the while."""
    t0 = time.monotonic()
    while not pred():
        took = time.monotonic() - t0
        check(took < limit, f"{what}: not within {limit} s")
        check(status(n.socks[0]) is not None, f"node 0's daemon stopped answering ({what})")
        time.sleep(0.1)
    return time.monotonic() - t0


def in_log(n, k, words):
    return lambda: words in text(n.log(k))


def stop_all(n):
    for d in n.daemons:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
    for k, d in enumerate(n.daemons):
        check(d.wait(timeout=20) == 0, f"node {k}'s daemon exited {d.returncode}")


def on_cluster(suffix, body):
    if not (DAEMON and TRAINER and CTL):
        raise Skip("GS_DAEMON, GS_TRAINER and GS_CTL are meson's: run it through meson test")
    if os.environ.get("GS_HAVE_GLOO") != "1":
        raise Skip("several nodes need Gloo")
    with Cluster(suffix, 2, "--rate", "1gbit") as c, \
            tempfile.TemporaryDirectory(prefix="gsnc-") as tmp:
        os.chmod(tmp, 0o755)
        n = Nodes(c, tmp, 2, *FLAGS)
        try:
            body(c, n, write_layout(tmp))
        except BaseException:
            n.dump()  # the daemons' side, before tmp goes
            raise


def test_partition_heals():
    def body(c, n, layout):
        run_step(n, "part", layout)
        link(c, 1, "down")
        took = timed(lambda: peer_state(n.socks[0], "part", 1) == "lost",
                     PEER_TIMEOUT + SLACK, "node 0 showing node 1 lost", n)
        print(f"node 0 showed node 1 lost {took:.2f} s into the partition "
              f"(--peer-timeout {PEER_TIMEOUT} s)")
        # Either the ping timer's verdict ("sent nothing for") or TCP's
        # own (TCP_USER_TIMEOUT: "its connection failed"), whichever comes
        # first; both take the coordinator as gone.
        took = timed(in_log(n, 1, "taking it as gone"), PEER_TIMEOUT + SLACK,
                     "node 1 taking node 0 as gone", n)
        print(f"node 1 took node 0 as gone {took:.2f} s later")
        link(c, 1, "up")
        took = timed(in_log(n, 1, "re-joined the coordinator"), 20,
                     "node 1 joining again once the link is back", n)
        print(f"node 1 joined again {took:.2f} s after its link came back")
        timed(lambda: peer_state(n.socks[0], "part", 1) == "joined", 10,
              "node 0 showing node 1 joined", n)
        run_step(n, "part", layout)
        stop_all(n)
    on_cluster("p", body)


def route(c, node, verb, to):
    """`ip route <verb> unreachable <to>` in node's namespace: what node
    sends to `to` goes nowhere, while what `to` sends still arrives."""
    c.ip(node, "route", verb, "unreachable", f"{to}/32")


def test_one_way_partition():
    """Node 1 hears node 0 but cannot answer. Its pings and answers go
    unacknowledged, so TCP gives up on the connection (TCP_USER_TIMEOUT),
    while node 0's stream stalls too, waiting for acknowledgements, so the
    ping timer may say so first: either way node 1 takes node 0 as gone
    within --peer-timeout and a slack and says why. The route back, it
    joins again and the next step is right."""
    def body(c, n, layout):
        run_step(n, "oneway", layout)
        route(c, 1, "add", COORDINATOR)
        took = timed(in_log(n, 1, "lost the connection to the coordinator"),
                     PEER_TIMEOUT + SLACK, "node 1 taking node 0 as gone", n)
        line = next(x for x in text(n.log(1)).splitlines()
                    if "lost the connection to the coordinator" in x)
        print(f"node 1 took node 0 as gone {took:.2f} s into the partition: {line}")
        check("taking it as gone" in line and "(it closed" not in line,
              f"node 1 does not say why the connection was lost: {line}")
        timed(lambda: peer_state(n.socks[0], "oneway", 1) == "lost", PEER_TIMEOUT + SLACK,
              "node 0 showing node 1 lost", n)
        route(c, 1, "del", COORDINATOR)
        timed(in_log(n, 1, "re-joined the coordinator"), 20,
              "node 1 joining again once it can answer", n)
        timed(lambda: peer_state(n.socks[0], "oneway", 1) == "joined", 10,
              "node 0 showing node 1 joined", n)
        run_step(n, "oneway", layout)
        stop_all(n)
    on_cluster("o", body)


def test_node_vanishes():
    def body(c, n, layout):
        run_step(n, "gone", layout)
        link(c, 1, "down")
        n.daemons[1].send_signal(signal.SIGKILL)
        n.daemons[1].wait(timeout=10)
        took = timed(lambda: peer_state(n.socks[0], "gone", 1) == "lost",
                     PEER_TIMEOUT + SLACK, "node 0 showing the vanished node 1 lost", n)
        print(f"node 0 showed node 1 lost {took:.2f} s after it vanished "
              f"(--peer-timeout {PEER_TIMEOUT} s)")
        log0 = text(n.log(0))
        # The ping timer's verdict or TCP's, whichever came first.
        check("rendezvous: node 1 (10.77.0.2:" in log0 and "taking it as lost" in log0,
              "node 0's log does not say node 1 at 10.77.0.2 was taken as lost")
        link(c, 1, "up")
        n.start(1)
        n.wait_ready(1)
        run_step(n, "gone", layout)
        check("joined as node 1 of 2" in text(n.log(1)), "the new node 1 did not join")
        check("two daemons claim it" not in text(n.log(1)),
              "the new node 1 was taken for a second claim")
        stop_all(n)
    on_cluster("v", body)


def test_link_down_at_join():
    def body(c, n, layout):
        link(c, 1, "down")
        p0, log0 = n.trainer(0, "late", layout, 1)
        p1, log1 = n.trainer(1, "late", layout, 1)
        t0 = time.monotonic()
        rc = p1.wait(timeout=JOIN_TIMEOUT + 30)
        took = time.monotonic() - t0
        print(f"node 1's trainer was refused {took:.2f} s after it started "
              f"(--join-timeout {JOIN_TIMEOUT} s): {text(log1).strip()[-300:]}")
        check(rc != 0, f"node 1's trainer passed with its link down: {text(log1)}")
        check(took < JOIN_TIMEOUT + SLACK + 2, f"the refusal took {took:.2f} s")
        check("10.77.0.1" in text(log1) or "coordinator" in text(log1),
              f"the refusal does not name the coordinator: {text(log1)}")
        check(status(n.socks[1]) is not None and n.daemons[1].poll() is None,
              "node 1's daemon stopped serving")
        p0.kill()
        p0.wait(timeout=10)
        # Node 0's own join of 'late' began a moment after node 1's and
        # ends at its own --join-timeout: a trainer that came before that
        # would be refused with it. The job runs anew once it is gone.
        timed(lambda: "jobs" in (status(n.socks[0]) or {}) and
              job_status(n.socks[0], "late") is None, JOIN_TIMEOUT + SLACK,
              "node 0's failed join of 'late' to end", n)
        link(c, 1, "up")
        run_step(n, "late", layout)
        stop_all(n)
    on_cluster("j", body)


if __name__ == "__main__":
    run([test_partition_heals, test_one_way_partition, test_node_vanishes, test_link_down_at_join])
