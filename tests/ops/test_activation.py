#!/usr/bin/env python3
"""Socket activation for real, with systemd-socket-activate: the daemon
starts on the first connection, serves on the socket it was passed (not
its own --socket), says READY=1, and leaves the socket file to its owner
when it stops; what is not one listening stream socket is refused."""
import json
import os
import shutil
import signal
import socket
import tempfile
import time

from opslib import (DAEMON, Skip, Trainer, check, check_eq, ctl, daemon_env, spawn, wait_for,
                    run)


def activator(args, daemon_args):
    if not shutil.which("systemd-socket-activate"):
        raise Skip("systemd-socket-activate is not installed (package systemd)")
    tmp = tempfile.mkdtemp(prefix="gs-act-")
    log = os.path.join(tmp, "log")
    argv = ["systemd-socket-activate"] + args(tmp) + [DAEMON, "--config="] + daemon_args(tmp)
    return tmp, log, spawn(argv, log, env=daemon_env())


def comm(pid):
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def test_started_by_the_first_connection():
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ntmp = tempfile.mkdtemp(prefix="gs-act-notify-")
    notify.bind(os.path.join(ntmp, "n"))
    # systemd-socket-activate passes only the variables -E names.
    tmp, log, p = activator(lambda t: ["-l", os.path.join(t, "activated.sock"), "-E",
                                       "NOTIFY_SOCKET=" + os.path.join(ntmp, "n")],
                            lambda t: [f"--socket={os.path.join(t, 'own.sock')}"])
    sock, own = os.path.join(tmp, "activated.sock"), os.path.join(tmp, "own.sock")
    try:
        wait_for(lambda: os.path.exists(sock), 10, "systemd-socket-activate's socket")
        time.sleep(0.3)
        check(comm(p.pid).startswith("systemd-socket"), "no daemon before the first connection")
        # The first connection starts gradsyncd, which answers it.
        s = json.loads(ctl(sock, "status", "--json", "--timeout", "20000").stdout)
        check_eq(comm(p.pid), "gradsyncd", "the activator became gradsyncd")
        check_eq(s["steps_completed"], 0, "a fresh daemon")
        check(not os.path.exists(own), "the daemon did not bind its own --socket")
        with open(log) as f:
            text = f.read()
        check(f"listening on {sock}, a socket passed by systemd" in text, f"log: {text}")
        notify.settimeout(10)
        check(b"READY=1" in notify.recv(4096), "READY=1 under socket activation")
        Trainer(sock, 0, [100, 5000], steps=2, log_dir=tmp).wait()
        check_eq(json.loads(ctl(sock, "status", "--json").stdout)["steps_completed"], 2,
                 "steps through the activated socket")
        p.send_signal(signal.SIGTERM)
        check_eq(p.wait(20), 0, "exit status")
        st = os.stat(sock)
        check(st and (st.st_mode & 0o170000) == 0o140000,
              "the activated socket's file outlives the daemon (systemd owns it)")
    finally:
        if p.poll() is None:
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(ntmp, ignore_errors=True)


def connect_and_close(path, kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_UNIX, kind)
    try:
        if kind == socket.SOCK_DGRAM:
            s.sendto(b"x", path)
        else:
            s.connect(path)
    finally:
        s.close()


def test_two_sockets_refused():
    tmp, log, p = activator(lambda t: ["-l", os.path.join(t, "a.sock"), "-l",
                                       os.path.join(t, "b.sock")], lambda t: [])
    try:
        wait_for(lambda: os.path.exists(os.path.join(tmp, "b.sock")), 10, "the sockets")
        connect_and_close(os.path.join(tmp, "a.sock"))
        check_eq(p.wait(20), 1, "exit status with two sockets")
        with open(log) as f:
            text = f.read()
        check("systemd passed 2 sockets; gradsyncd takes exactly one" in text, text)
    finally:
        if p.poll() is None:
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def test_datagram_socket_refused():
    tmp, log, p = activator(lambda t: ["-d", "-l", os.path.join(t, "d.sock")], lambda t: [])
    try:
        wait_for(lambda: os.path.exists(os.path.join(tmp, "d.sock")), 10, "the socket")
        connect_and_close(os.path.join(tmp, "d.sock"), socket.SOCK_DGRAM)
        check_eq(p.wait(20), 1, "exit status with a datagram socket")
        with open(log) as f:
            text = f.read()
        check("is not a listening Unix stream socket" in text, text)
    finally:
        if p.poll() is None:
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def test_listen_fds_for_another_process_ignored():
    from opslib import Daemon
    d = Daemon(env={"LISTEN_FDS": "1", "LISTEN_PID": "1"})
    try:
        check(os.path.exists(d.socket), "the daemon bound its own socket")
        check("passed by systemd" not in d.log_text(), "no socket taken from systemd")
    finally:
        d.cleanup()


if __name__ == "__main__":
    run([test_started_by_the_first_connection, test_two_sockets_refused,
         test_datagram_socket_refused, test_listen_fds_for_another_process_ignored])
