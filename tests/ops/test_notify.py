#!/usr/bin/env python3
"""gradsyncd and systemd's notification protocol, with a notification
socket this test listens on: READY=1 only once the socket answers (and,
with several nodes, once the node has joined), STATUS= lines that follow
the job, STOPPING=1 on SIGTERM, none of it on a failed start; and the
journald priority prefixes of its log lines."""
import atexit
import os
import re
import shutil
import signal
import socket
import tempfile
import time

from opslib import (HAVE_GLOO, Daemon, Job, Skip, Trainer, check, check_eq, ctl, run, wait_for)


class Listener:
    """A notification socket, as systemd's: one datagram per sd_notify."""

    def __init__(self, abstract=False):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"gs-ops-notify-{os.getpid()}-{time.monotonic_ns()}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            self.dir = tempfile.mkdtemp(prefix="gs-notify-")
            self.address = os.path.join(self.dir, "notify")
            self.sock.bind(self.address)
            atexit.register(shutil.rmtree, self.dir, True)
        self.messages = []

    def receive(self, timeout):
        """The next datagram's lines, or None after timeout seconds."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096).decode()
        except socket.timeout:
            return None
        self.messages.append(data)
        return data.split("\n")

    def wait_for(self, key, timeout, on_message=None):
        """Lines until one starts with key; fails after timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            check(left > 0, f"no {key} within {timeout} s; got {self.messages}")
            lines = self.receive(left)
            if lines is None:
                continue
            if on_message:
                on_message(lines)
            for line in lines:
                if line.startswith(key):
                    return line

    def keys(self):
        return [l.split("=")[0] for m in self.messages for l in m.split("\n")]


def test_ready_status_stopping():
    n = Listener()
    job = Job(local_size=1)
    d = Daemon(env={"NOTIFY_SOCKET": n.address}, wait=False, job=job)
    try:
        answered = []

        def probe(lines):
            # At READY=1 the socket must already answer.
            if "READY=1" in lines:
                answered.append(ctl(d.socket, "status", check_rc=None).returncode)

        n.wait_for("READY=1", 30, probe)
        check_eq(answered, [0], "gradsyncctl status at the moment of READY=1")
        check(any(m.startswith("READY=1\nSTATUS=idle") for m in n.messages),
              f"READY=1 comes with a status line: {n.messages}")
        Trainer(d.socket, 0, [1000, 3000, 20], steps=2, log_dir=d.dir, job=job).wait()
        line = n.wait_for("STATUS=", 10)
        while "2 steps done" not in line:
            line = n.wait_for("STATUS=", 10)
        check(re.match(r"STATUS=(idle, no job|1 job, 0 trainers); 2 steps done, 0 aborted", line),
              line)
        d.proc.send_signal(signal.SIGTERM)
        n.wait_for("STOPPING=1", 20)
        check_eq(d.proc.wait(20), 0, "exit status after SIGTERM")
        keys = n.keys()
        check_eq(keys.count("READY"), 1, "READY=1 once")
        check(keys.index("READY") < keys.index("STOPPING"), "READY before STOPPING")
    finally:
        d.cleanup()


def test_abstract_notify_socket():
    n = Listener(abstract=True)
    d = Daemon(env={"NOTIFY_SOCKET": n.address}, wait=False)
    try:
        n.wait_for("READY=1", 30)
        d.stop()
        n.wait_for("STOPPING=1", 10)
    finally:
        d.cleanup()


def test_failed_start_is_never_ready():
    n = Listener()
    # Nobody can create a socket under /proc; the later --socket wins.
    d = Daemon(["--socket=/proc/gs-ops/gs.sock"], env={"NOTIFY_SOCKET": n.address}, wait=False)
    try:
        check_eq(d.proc.wait(30), 1, "exit status of a daemon that cannot listen")
        while n.receive(0.2) is not None:
            pass
        check("READY" not in n.keys(), f"no READY=1 from a failed start: {n.messages}")
        check("cannot listen on /proc/gs-ops/gs.sock" in d.log_text(), "the log says why")
    finally:
        d.cleanup()


def test_ready_needs_no_other_node():
    """gradsyncd is ready once its socket and its node port listen: jobs,
    and the other nodes of each, come later with their trainers. A job of
    two nodes then runs between two daemons that were both ready alone."""
    if not HAVE_GLOO:
        raise Skip("this build has no Gloo: one node only")
    job = Job(nodes=2)
    n0, n1 = Listener(), Listener()
    d0 = Daemon(env={"NOTIFY_SOCKET": n0.address}, wait=False, job=job, node=0)
    d1 = None
    try:
        n0.wait_for("READY=1", 30)
        check(any(m.startswith("READY=1\nSTATUS=idle, no job") for m in n0.messages),
              f"ready and idle, alone: {n0.messages}")
        d1 = Daemon(env={"NOTIFY_SOCKET": n1.address}, wait=False, job=job, node=1)
        n1.wait_for("READY=1", 30)
        trainers = [Trainer(d.socket, 0, [1000, 20], steps=1, log_dir=d.dir, job=job, node=r)
                    for r, d in enumerate((d0, d1))]
        for t in trainers:
            t.wait()
        s = ctl(d1.socket, "status", "--json")
        check('"nodes":2' in s.stdout, f"node 1 answers as one of 2 nodes: {s.stdout}")
    finally:
        for d in (d1, d0):
            if d:
                d.cleanup()


def test_journal_priority_prefixes():
    tmp = tempfile.mkdtemp(prefix="gs-journal-")
    log = os.path.join(tmp, "gradsyncd.log")
    open(log, "w").close()
    st = os.stat(log)
    # JOURNAL_STREAM names the file the daemon's stderr goes to, as systemd
    # names the journal's stream.
    d = Daemon(env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, wait=False, tmp=tmp)
    try:
        d.wait_ready()
        ctl(d.socket, "trace", "stop", check_rc=1)  # logged as a warning
        d.stop()
        lines = d.log_text().splitlines()
        check(lines and all(re.match(r"^<[3467]>(error|warning|info|debug): ", l) for l in lines),
              f"every line has a priority prefix: {lines}")
        check(any(l.startswith("<4>warning: ") for l in lines), "a warning at priority 4")
        check(any(l.startswith("<6>info: ") for l in lines), "info at priority 6")
    finally:
        d.cleanup()
    # An inherited JOURNAL_STREAM that is not stderr: plain lines.
    d = Daemon(env={"JOURNAL_STREAM": "1:1"})
    try:
        d.stop()
        first = d.log_text().splitlines()[0]
        check(re.match(r"^\d\d:\d\d:\d\d\.\d{3} gradsyncd ", first), f"timestamped: {first}")
    finally:
        d.cleanup()


if __name__ == "__main__":
    run([test_ready_status_stopping, test_abstract_notify_socket, test_failed_start_is_never_ready,
         test_ready_needs_no_other_node, test_journal_priority_prefixes])
