"""gradsyncd on the nodes of a cluster of scripts/netcluster.sh: one daemon
per node in its namespace, on a socket of its own, reaching the others on
the node port over its shaped link; trainers of a job beside them; and
what node 0's status says of a job. Paths come from meson: GS_DAEMON,
GS_TRAINER, GS_CTL."""
import json
import os
import subprocess

from opslib import LAUNCH_VARS, daemon_env, spawn, wait_for

DAEMON = os.environ.get("GS_DAEMON", "")
TRAINER = os.environ.get("GS_TRAINER", "")
CTL = os.environ.get("GS_CTL", "")
PORT = 29470  # each node has its own namespace, so no other test's port


def text(path):
    with open(path, errors="replace") as f:
        return f.read()


def status(sock):
    """A daemon's status, or None when it does not answer within 2 s."""
    try:
        p = subprocess.run([CTL, "--socket", sock, "--timeout", "2000", "status", "--json"],
                           capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(p.stdout) if p.returncode == 0 else None


def metric(sock, name, job):
    """A job's series `name` in a daemon's metrics, or None."""
    p = subprocess.run([CTL, "--socket", sock, "--timeout", "2000", "metrics"],
                       capture_output=True, text=True, timeout=5)
    prefix = f'{name}{{job="{job}"}} '
    for line in p.stdout.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return None


def job_status(sock, job):
    st = status(sock)
    return next((j for j in (st or {}).get("jobs", []) if j["job_id"] == job), None)


def peer_state(sock, job, node):
    """Node `node` as the daemon at sock sees it in `job`, or None."""
    peers = (job_status(sock, job) or {}).get("peers") or []
    return peers[node]["state"] if node < len(peers) else None


class Nodes:
    """A daemon on each of the `count` nodes of cluster c, on sockets in
    tmp, with `flags` besides the node's address and port; `cpus`: the
    CPUs each daemon may use ("0-1"), else its node's one."""

    def __init__(self, c, tmp, count, *flags, cpus=None):
        self.c, self.tmp, self.count, self.flags = c, tmp, count, flags
        self.wide = ["taskset", "-c", cpus] if cpus else []
        self.socks = [os.path.join(tmp, f"n{k}.sock") for k in range(count)]
        self.daemons = [None] * count
        self.starts = [0] * count
        for k in range(count):
            self.start(k)
        for k in range(count):
            self.wait_ready(k)

    def log(self, k):
        """Node k's daemon's log (of its latest start)."""
        return os.path.join(self.tmp, f"daemon-{k}.{self.starts[k]}.log")

    def start(self, k):
        """Starts node k's daemon (again, once the last one is gone)."""
        self.starts[k] += 1
        argv = self.c.argv(k, *self.wide, DAEMON, f"--socket={self.socks[k]}",
                           f"--node-address=10.77.0.{k + 1}", f"--node-port={PORT}",
                           "--config=", *self.flags)
        self.daemons[k] = spawn(argv, self.log(k), env=daemon_env())

    def wait_ready(self, k):
        wait_for(lambda: status(self.socks[k]), 30, f"node {k}'s daemon")

    def trainer(self, k, job, layout, steps, *extra, settings=None):
        """Node k's trainer of `job` (one trainer per node, node 0 the
        coordinator), checking every element of `steps` steps; settings:
        more of the job's variables (GRADSYNC_THRESHOLD, ...)."""
        env = {key: v for key, v in os.environ.items() if key not in LAUNCH_VARS}
        env.update(GRADSYNC_NODES=str(self.count), GRADSYNC_NODE_RANK=str(k),
                   GRADSYNC_COORDINATOR="10.77.0.1", GRADSYNC_LOCAL_SIZE="1",
                   GRADSYNC_JOB_ID=job, **(settings or {}))
        log = os.path.join(self.tmp, f"{job}-trainer-{k}.log")
        argv = self.c.argv(k, TRAINER, "--socket", self.socks[k], "--layout", layout,
                           "--steps", str(steps), *extra)
        return spawn(argv, log, env=env), log

    def dump(self):
        """Every daemon's log's end, for a failed test's output."""
        for k in range(self.count):
            for s in range(1, self.starts[k] + 1):
                path = os.path.join(self.tmp, f"daemon-{k}.{s}.log")
                if os.path.exists(path):
                    print(f"--- node {k}'s daemon (start {s}):\n" + text(path)[-4000:])
