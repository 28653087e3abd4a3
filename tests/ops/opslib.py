"""Helpers of the operations tests: real gradsyncd and trainer processes on
temporary sockets, gradsyncctl runs, an independent bucket plan, and a
tiny test runner whose summary line scripts/test.sh counts.

Paths come from the environment meson sets: GS_DAEMON, GS_CTL,
GS_OPS_TRAINER, GS_BUILD_ROOT, GS_SOURCE_ROOT, GS_HAVE_GLOO.
"""
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

DAEMON = os.environ.get("GS_DAEMON", "")
CTL = os.environ.get("GS_CTL", "")
TRAINER = os.environ.get("GS_OPS_TRAINER", "")
BUILD = os.environ.get("GS_BUILD_ROOT", "")
SOURCE = os.environ.get("GS_SOURCE_ROOT", "")
HAVE_GLOO = os.environ.get("GS_HAVE_GLOO") == "1"

SKIP = 77  # meson's "skipped"


class Skip(Exception):
    """Raised by a test that cannot run here; the reason is printed."""


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def check_eq(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, expected {want!r}")


def wait_for(pred, timeout, what, step=0.05):
    """Polls pred() until it is truthy; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


# ---- processes ---------------------------------------------------------------

_children = []


def spawn(argv, log, env=None, stdin=subprocess.DEVNULL, **kw):
    out = open(log, "wb")
    p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=stdin,
                         env=env, **kw)
    out.close()
    _children.append(p)
    return p


def reap_all():
    """Kills what a failed test left running (only our own children)."""
    for p in _children:
        if p.poll() is None:
            p.kill()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
    _children.clear()


def daemon_env(extra=None, drop=()):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GRADSYNC_") and k not in ("NOTIFY_SOCKET", "LISTEN_FDS",
                                                         "LISTEN_PID", "JOURNAL_STREAM")}
    for k in drop:
        env.pop(k, None)
    env.update(extra or {})
    return env


# ---- the job ---------------------------------------------------------------------

# The launcher variables libgradsync reads (client/launch.c): a trainer is
# given its job's and nothing else a shell may have exported.
LAUNCH_VARS = (
    "GRADSYNC_JOB_ID", "GRADSYNC_LOCAL_RANK", "GRADSYNC_LOCAL_SIZE", "GRADSYNC_NODES",
    "GRADSYNC_NODE_RANK", "GRADSYNC_COORDINATOR", "GRADSYNC_THRESHOLD", "GRADSYNC_WIRE",
    "GRADSYNC_OP", "GRADSYNC_PREDIVIDE", "GRADSYNC_FUSION_BUFFER",
    "TORCHELASTIC_RUN_ID", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_RANK",
    "MASTER_ADDR", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NNODES", "SLURM_NODEID",
)


def node_host(node):
    """The loopback address of node `node`'s daemon: 127.0.0.<node + 1>."""
    return f"127.0.0.{node + 1}"


class Job:
    """A job as its trainers carry it, in libgradsync's environment
    (GRADSYNC_*): described once by a test, given to every Trainer. Its
    first trainer defines it; a field left None takes the default (local
    size 1, nodes 1, threshold 2097152, wire fp16, op average, predivide
    world, fusion buffer 4194304). local_size is every node's trainer
    count, or a list of them; coordinator, the host of node 0's daemon,
    defaults to its address with several nodes; port is where the daemons
    reach each other (--node-port; node 0's rendezvous), picked when None."""

    def __init__(self, job_id=None, local_size=None, nodes=None, coordinator=None, port=None,
                 threshold=None, wire=None, op=None, predivide=None, fusion_buffer=None):
        self.job_id, self.local_size, self.nodes = job_id, local_size, nodes
        self.coordinator, self.port = coordinator, port
        self.threshold, self.wire, self.op = threshold, wire, op
        self.predivide, self.fusion_buffer = predivide, fusion_buffer

    def local_size_of(self, node):
        if isinstance(self.local_size, (list, tuple)):
            return self.local_size[node]
        return self.local_size

    def coordinator_host(self):
        if self.coordinator is not None:
            return self.coordinator
        return node_host(0) if self.nodes and self.nodes > 1 else None

    def node_port(self):
        if self.port is None:
            self.port = free_port()
        return self.port

    def env(self, node=0):
        """The variables (name: value) of a trainer of node `node`: only
        the fields the job sets."""
        env = {}
        fields = [("GRADSYNC_JOB_ID", self.job_id),
                  ("GRADSYNC_LOCAL_SIZE", self.local_size_of(node)),
                  ("GRADSYNC_NODES", self.nodes),
                  ("GRADSYNC_NODE_RANK", node if self.nodes else None),
                  ("GRADSYNC_COORDINATOR", self.coordinator_host()),
                  ("GRADSYNC_THRESHOLD", self.threshold), ("GRADSYNC_WIRE", self.wire),
                  ("GRADSYNC_OP", self.op), ("GRADSYNC_PREDIVIDE", self.predivide),
                  ("GRADSYNC_FUSION_BUFFER", self.fusion_buffer)]
        for name, value in fields:
            if value is not None:
                env[name] = str(value)
        return env


def node_flags(job, node=0):
    """The daemon's flags of a node of a job of several nodes: where the
    others reach it."""
    return [f"--node-address={node_host(node)}", f"--node-port={job.node_port()}"]


def daemon_job_flags(job, node=0):
    """The flags of node `node`'s daemon of the job: the node port of a job
    of several nodes; else none (--node-port=0: tests run side by side, and
    one default port would be taken by the first). The job itself is its
    trainers' to give."""
    if job is not None and job.nodes and job.nodes > 1:
        return node_flags(job, node)
    return ["--node-port=0"]


def trainer_env(job, node=0):
    """This process's environment without any launcher's variables, and
    the job's of node `node` (None: none, a job of one trainer)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    if job is not None:
        env.update(job.env(node))
    return env


def free_port():
    """A TCP port nothing is bound to, below the kernel's ephemeral range
    (so that no connection's own end takes it before a daemon binds it:
    the daemons of a job all bind the node port, on several addresses)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    start = 10000 if low > 12000 else 1024
    for _ in range(1000):
        port = random.randrange(start, max(start + 1, low))
        s = socket.socket()
        try:
            s.bind(("", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise AssertionError(f"no free TCP port below {low}")


class Daemon:
    """gradsyncd on a socket of its own; no configuration file unless the
    test names one. job: the job its trainers are given, node: this
    daemon's node of it; args come after the job's flags; prefix runs it
    under another command (chrt, say)."""

    def __init__(self, args=(), env=None, config="", wait=True, tmp=None, job=None, node=0,
                 prefix=()):
        self.dir = tmp or tempfile.mkdtemp(prefix="gs-ops-")
        self.socket = os.path.join(self.dir, "gs.sock")
        self.log = os.path.join(self.dir, "gradsyncd.log")
        argv = [DAEMON, f"--socket={self.socket}"]
        if config is not None:
            argv.append(f"--config={config}")
        if not any(str(a).startswith("--node-port") for a in args):
            argv += daemon_job_flags(job, node)
        argv += list(args)
        self.proc = spawn(list(prefix) + argv, self.log, env=daemon_env(env))
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout=30):
        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"gradsyncd exited with {self.proc.returncode}:\n"
                                     + self.log_text())
            return ctl(self.socket, "status", check_rc=None).returncode == 0
        wait_for(up, timeout, "gradsyncd to answer on " + self.socket)

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("gradsyncd did not stop within %d s after SIGTERM" % timeout)

    def cleanup(self):
        if self.proc.poll() is None:
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def ctl(sock, *args, check_rc=0, timeout=30, env=None, user=None):
    """Runs gradsyncctl; check_rc None accepts any exit status."""
    argv = [CTL, "--socket", sock] + list(args) if sock else [CTL] + list(args)
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + argv
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       env=daemon_env(env))
    if check_rc is not None and r.returncode != check_rc:
        raise AssertionError(f"gradsyncctl {' '.join(args)} exited {r.returncode}, expected "
                             f"{check_rc}\nstdout: {r.stdout}\nstderr: {r.stderr}")
    return r


def status(sock):
    return json.loads(ctl(sock, "status", "--json").stdout)


class Trainer:
    """An ops-trainer process (see ops-trainer.c) of node `node` of job,
    given the job in its environment."""

    def __init__(self, sock, rank, counts, steps=1, clip=0, nan=False, abandon_at=0,
                 hold=False, log_dir=None, job=None, node=0):
        argv = [TRAINER, "--socket", sock, "--rank", str(rank),
                "--counts", ",".join(map(str, counts)), "--steps", str(steps)]
        if clip:
            argv += ["--clip", repr(float(clip))]
        if nan:
            argv.append("--nan")
        if abandon_at:
            argv += ["--abandon-at", str(abandon_at)]
        if hold:
            argv.append("--hold")
        self.log = os.path.join(log_dir or tempfile.gettempdir(),
                                f"trainer-{rank}-{os.getpid()}-{id(self)}.log")
        self.proc = spawn(argv, self.log, env=trainer_env(job, node),
                          stdin=subprocess.PIPE if hold else subprocess.DEVNULL)

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def wait_line(self, prefix, timeout=60):
        def found():
            for line in self.text().splitlines():
                if line.startswith(prefix):
                    return line
            if self.proc.poll() is not None:
                raise AssertionError(f"trainer exited {self.proc.returncode} before "
                                     f"'{prefix}':\n{self.text()}")
            return None
        return wait_for(found, timeout, f"trainer line '{prefix}'")

    def release(self):
        """Ends a --hold trainer."""
        self.proc.stdin.close()

    def wait(self, timeout=120):
        rc = self.proc.wait(timeout)
        if rc != 0:
            raise AssertionError(f"trainer exited {rc}:\n{self.text()}")
        return [dict(zip(line.split()[0::2], line.split()[1::2]))
                for line in self.text().splitlines() if line.startswith("step ")]


# ---- an independent bucket plan ------------------------------------------------

def plan(counts, threshold):
    """The bucket rule of backward_and_update_half, written from DESIGN.md:
    a tensor over the threshold goes alone at once; smaller ones join the
    pending group, which goes when its sum exceeds the threshold, and at
    the end. Returns the buckets' element counts in launch order."""
    buckets, pending, acc = [], 0, 0
    for n in counts:
        if n > threshold:
            buckets.append(n)
            continue
        pending += n
        acc += n
        if acc > threshold:
            buckets.append(pending)
            pending = acc = 0
    if pending:
        buckets.append(pending)
    return buckets


def inputs(rank, t, count):
    """ops-trainer's inputs, recomputed."""
    return [((i * 7 + t * 5 + rank * 3) % 11 - 5) * 0.5 for i in range(count)]


def clipped(rank, counts, clip, nan=False):
    n = 0
    for t, c in enumerate(counts):
        xs = inputs(rank, t, c)
        if nan and rank == 0 and t == 0:
            xs = xs[1:]
        n += sum(1 for x in xs if abs(x) > clip)
    return n


# ---- the runner ----------------------------------------------------------------

def run(tests):
    """Runs each test function in turn; prints cmocka-like lines so that
    scripts/test.sh counts the cases. Exit 0, 1 on a failure, or 77 when
    every test was skipped."""
    passed = failed = skipped = 0
    for t in tests:
        name = t.__name__
        print(f"[ RUN      ] {name}", flush=True)
        try:
            t()
            print(f"[       OK ] {name}", flush=True)
            passed += 1
        except Skip as e:
            print(f"[  SKIPPED ] {name}: {e}", flush=True)
            skipped += 1
        except Exception:
            traceback.print_exc(file=sys.stdout)
            print(f"[  FAILED  ] {name}", flush=True)
            failed += 1
        finally:
            reap_all()
    if skipped and not passed and not failed:
        sys.exit(SKIP)  # no counts: scripts/test.sh counts the skip itself
    print(f"[  PASSED  ] {passed} test(s).")
    if failed:
        print(f"[  FAILED  ] {failed} test(s).")
        sys.exit(1)
    sys.exit(0)
