"""What the tests of scripts/netcluster.sh share: the script's commands,
a cluster brought up and always taken down, and what the host shows."""
import os
import subprocess

from opslib import Skip

SOURCE = os.environ.get("GS_SOURCE_ROOT") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NETCLUSTER = os.path.join(SOURCE, "scripts", "netcluster.sh")
BASE = f"t{os.getpid() % 100000}"  # this run's clusters are BASE + a letter


def nc(*args, timeout=30, check_rc=0):
    p = subprocess.run([NETCLUSTER, *args], capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode == 77:
        raise Skip(p.stderr.strip())
    if check_rc is not None and p.returncode != check_rc:
        raise AssertionError(f"netcluster.sh {' '.join(args)}: exit {p.returncode}, "
                             f"expected {check_rc}: {p.stderr.strip()}")
    return p


def namespaces(name):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         timeout=10).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.startswith(f"gsnc-{name}-")]


def host_veths():
    out = subprocess.run(["ip", "-o", "link", "show", "type", "veth"],
                         capture_output=True, text=True, timeout=10).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


class Cluster:
    """`up` on entry, `down` on exit whatever happened inside."""

    def __init__(self, suffix, nodes, *flags):
        self.name = BASE + suffix
        self.args = (self.name, str(nodes), *flags)

    def __enter__(self):
        nc("down", self.name)
        try:
            self.up = nc("up", *self.args)
        except BaseException:
            nc("down", self.name, check_rc=None)
            raise
        return self

    def __exit__(self, *exc):
        nc("down", self.name)

    def netns(self, node):
        """The network namespace of node `node`."""
        return f"gsnc-{self.name}-n{node}"

    def ip(self, node, *args):
        """`ip ARGS` on node `node`'s side of the network (its links,
        routes), from outside; raises if it fails."""
        subprocess.run(["ip", "-n", self.netns(node), *args], check=True, timeout=10)

    def exec(self, node, *cmd, timeout=30):
        return subprocess.run(self.argv(node, *cmd), capture_output=True, text=True,
                              timeout=timeout)

    def argv(self, node, *cmd):
        """CMD run on node `node`: exec leaves no shell between, so the
        process started is CMD itself."""
        return [NETCLUSTER, "exec", self.name, str(node), *cmd]
