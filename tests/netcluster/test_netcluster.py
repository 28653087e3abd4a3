"""scripts/netcluster.sh against what the kernel reports: a shaped link's
goodput, the CPUs of a node's processes, and that nothing is left after
`down`, after a failed `up` and after an `up` killed half-way. Skipped (77,
with the script's reason) where namespaces cannot be made.

Run as root: python3 tests/netcluster/test_netcluster.py (meson sets
GS_SOURCE_ROOT; without it the tree this file is in is used).
"""
import json
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("GS_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "tests", "ops"))
from opslib import Skip, check, run, wait_for  # noqa: E402
from cluster import BASE, NETCLUSTER, Cluster, host_veths, namespaces, nc  # noqa: E402

FLOW = os.path.join(HERE, "flow.py")


# ---- a shaped link -------------------------------------------------------------

SECONDS = 2.0


def goodput(c):
    """Bytes per second of a TCP flow from node 0 to node 1, and the
    sender's segment size."""
    recv = subprocess.Popen(c.argv(1, sys.executable, FLOW, "recv", "5001",
                                    str(SECONDS + 0.3)),
                            stdout=subprocess.PIPE, text=True)
    try:
        send = c.exec(0, sys.executable, FLOW, "send", "10.77.0.2", "5001",
                      str(SECONDS + 0.3), timeout=SECONDS + 15)
        check(send.returncode == 0, f"sender: {send.stderr}")
        out, _ = recv.communicate(timeout=15)
    finally:
        recv.kill()
        recv.wait()
    r = json.loads(out)
    check(r["seconds"] > SECONDS * 0.8, f"the flow lasted {r['seconds']:.2f} s")
    return r["bytes"] / r["seconds"], r["mss"]


def expected_goodput(rate_bits, mss, c):
    """What tbf lets through as TCP payload. tbf counts each frame's bytes
    from the Ethernet header on (a GSO packet as its segments, each with its
    headers): a full segment is MTU + 14 bytes on the link and carries MSS
    bytes of payload (the MTU less the IP and TCP headers, TCP's options
    included), so goodput is rate * MSS / (MTU + 14): 95.6% for 1448 of
    1514. Preamble, FCS and the inter-frame gap are on no veth, and ACKs go
    the other way, through the other direction's tbf."""
    mtu = int(c.exec(0, "cat", "/sys/class/net/eth0/mtu").stdout)
    return rate_bits / 8 * mss / (mtu + 14)


def test_shaped_rate():
    got = {}
    for mbit, suffix in ((200, "a"), (100, "b")):
        with Cluster(suffix, 2, "--rate", f"{mbit}mbit") as c:
            bps, mss = goodput(c)
            want = expected_goodput(mbit * 1e6, mss, c)
        print(f"{mbit}mbit: goodput {bps * 8 / 1e6:.1f} Mbit/s, expected "
              f"{want * 8 / 1e6:.1f} (MSS {mss}): {100 * (bps / want - 1):+.1f}%")
        check(abs(bps / want - 1) < 0.10, f"{mbit}mbit: goodput off by more than 10%")
        got[mbit] = bps
    ratio = got[200] / got[100]
    check(1.7 < ratio < 2.3, f"200mbit carried {ratio:.2f} times 100mbit's goodput")


RTT = """
import socket, time
best = 1e9
for _ in range(20):  # a refused connect is one round trip: SYN out, RST back
    t = time.monotonic()
    try:
        socket.create_connection(("10.77.0.2", 9), timeout=2).close()
    except ConnectionRefusedError:
        best = min(best, time.monotonic() - t)
print(best)
"""


def test_delay():
    """A round trip between two nodes crosses four delayed egresses (node
    0's eth0, node 1's port on the bridge, and back), so it takes at least
    4 x DELAY. Without netem an explicit --delay is refused (77) naming it,
    leaving nothing."""
    name = BASE + "h"
    try:
        p = subprocess.run([NETCLUSTER, "up", name, "2", "--delay", "5ms"],
                           capture_output=True, text=True, timeout=30)
        if p.returncode == 77 and "netem" in p.stderr:
            print(f"refused: {p.stderr.strip()}")
            check(namespaces(name) == [], f"namespaces left: {namespaces(name)}")
            with Cluster("i", 2, "--delay", "0") as c:
                rtt = float(c.exec(0, sys.executable, "-c", RTT).stdout)
            print(f"the links' own round trip: {rtt * 1e6:.0f} us")
            return
        check(p.returncode == 0, f"up --delay 5ms: exit {p.returncode}: {p.stderr}")
        out = subprocess.run([NETCLUSTER, "exec", name, "0", sys.executable, "-c", RTT],
                             capture_output=True, text=True, timeout=60)
        rtt = float(out.stdout)
        print(f"round trip {rtt * 1e3:.2f} ms with --delay 5ms on each egress")
        check(0.020 <= rtt < 0.030, f"round trip {rtt * 1e3:.2f} ms, expected 20 ms and up to 10 more")
    finally:
        nc("down", name, check_rc=None)


# ---- pinning -------------------------------------------------------------------

def test_pinning():
    # Three nodes: on two cores (or one) at least two nodes share a core.
    allowed = sorted(os.sched_getaffinity(0))
    with Cluster("c", 3) as c:
        for k in range(3):
            want = allowed[k % len(allowed)]
            p = c.exec(k, sys.executable, "-c",
                       "import os; print(sorted(os.sched_getaffinity(0)))")
            check(p.returncode == 0, p.stderr)
            check(p.stdout.strip() == f"[{want}]",
                  f"node {k} runs on {p.stdout.strip()}, expected [{want}]")
            check(nc("cpus", c.name, str(k)).stdout.strip() == str(want), "cpus helper")
            check(f"node {k}: gsnc-{c.name}-n{k} 10.77.0.{k + 1} cpu {want}" in c.up.stdout,
                  f"up's mapping: {c.up.stdout}")
            addrs = c.exec(k, "ip", "-4", "-o", "addr", "show", "dev", "eth0").stdout
            check(f"inet 10.77.0.{k + 1}/24" in addrs, f"node {k}'s eth0: {addrs}")


# ---- teardown ------------------------------------------------------------------

def check_nothing_left(name, before):
    check(namespaces(name) == [], f"namespaces left: {namespaces(name)}")
    check(host_veths() == before, f"veths in the host's namespace: {host_veths()}")


def test_teardown():
    before = host_veths()
    with Cluster("d", 2) as c:
        sleeper = subprocess.Popen(c.argv(1, "sleep", "600"))
        wait_for(lambda: subprocess.run(["ip", "netns", "pids", c.netns(1)],
                                        capture_output=True, text=True).stdout.strip(),
                 10, "the sleeper in node 1")
    # `down` has killed the process in node 1 (exec left no shell between).
    check(sleeper.wait(timeout=10) == -signal.SIGKILL, "the sleeper was not killed")
    check_nothing_left(c.name, before)
    nc("down", c.name)  # again, and of nothing: fine
    nc("down", BASE + "none")


def start_up_and_stop(name, sig):
    """Starts `up` of 64 nodes (a second or so) and sends it sig once its
    second node exists."""
    p = subprocess.Popen([NETCLUSTER, "up", name, "64"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: f"gsnc-{name}-n1" in namespaces(name) or p.poll() is not None,
                 20, "up's second node")
        if p.poll() is not None:
            raise AssertionError(f"up ended before its second node: {p.stderr.read()}")
        p.send_signal(sig)
        p.wait(timeout=20)
    finally:
        p.kill()
        p.wait()
    return p.returncode


def test_teardown_after_failure():
    before = host_veths()
    name = BASE + "e"
    try:
        # A step that fails half-way (tc refuses the rate, after the bridge
        # and a node were made): up undoes what it made.
        p = nc("up", name, "2", "--rate", "10furlongs", check_rc=1)
        check("furlongs" in p.stderr, f"tc's complaint: {p.stderr}")
        check_nothing_left(name, before)
        # Stopped half-way (SIGTERM): its trap takes the cluster down.
        rc = start_up_and_stop(name, signal.SIGTERM)
        check(rc == 143, f"up stopped by SIGTERM exited {rc}")
        check_nothing_left(name, before)
        # Killed half-way (no trap runs): down takes it down.
        start_up_and_stop(name, signal.SIGKILL)
        check(namespaces(name) != [], "SIGKILL left nothing to take down")
        nc("down", name)
        check_nothing_left(name, before)
        # A command that fails inside a wrapper that takes the cluster down.
        p = subprocess.run(["bash", "-c", f'set -e; trap "{NETCLUSTER} down {name}" EXIT; '
                            f'{NETCLUSTER} up {name} 2 >/dev/null; '
                            f'{NETCLUSTER} exec {name} 1 false; echo not reached'],
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 1 and "not reached" not in p.stdout, f"wrapper: {p}")
        check_nothing_left(name, before)
    finally:
        nc("down", name, check_rc=None)


# ---- skips ---------------------------------------------------------------------

def test_skip_without_root():
    if os.getuid() != 0:
        raise Skip("not root: the script's own skip is what every other case met")
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        NETCLUSTER, "up", BASE + "f", "1"],
                       capture_output=True, text=True, timeout=30)
    check(p.returncode == 77, f"exit {p.returncode}: {p.stderr}")
    check("not root" in p.stderr, f"reason: {p.stderr}")
    check(namespaces(BASE + "f") == [], "a namespace was made")


if __name__ == "__main__":
    run([test_shaped_rate, test_delay, test_pinning, test_teardown, test_teardown_after_failure,
         test_skip_without_root])
