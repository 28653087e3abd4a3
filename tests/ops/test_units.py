#!/usr/bin/env python3
"""The systemd units and the sysusers entry: systemd-analyze verify passes
on them (and fails on a broken copy, so the check can fail), the units
hold what the service needs, and systemd-sysusers creates the user and
group from the entry."""
import os
import re
import shutil
import subprocess
import tempfile

from opslib import (BUILD, DAEMON, HAVE_GLOO, Daemon, Job, Skip, Trainer, check, check_eq,
                    daemon_env, run)

UNITS = os.path.join(BUILD, "systemd")


def parse_unit(path):
    """{(section, key): [values]} of a unit file."""
    out, section = {}, None
    for line in open(path):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault((section, key.strip()), []).append(value.strip())
    return out


def for_verify(tmp):
    """Copies of the built units whose ExecStart names the built daemon
    (verify checks that it is executable); nothing else changes."""
    for name in ["gradsyncd.service", "gradsyncd.socket"]:
        text = open(os.path.join(UNITS, name)).read()
        text = re.sub(r"^ExecStart=\S+", f"ExecStart={DAEMON}", text, flags=re.M)
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
    return [os.path.join(tmp, n) for n in ["gradsyncd.service", "gradsyncd.socket"]]


def verify(paths):
    return subprocess.run(["systemd-analyze", "verify", "--man=no"] + paths,
                          capture_output=True, text=True, timeout=60)


def test_systemd_analyze_verify():
    if not shutil.which("systemd-analyze"):
        raise Skip("systemd-analyze is not installed (package systemd)")
    tmp = tempfile.mkdtemp(prefix="gs-units-")
    paths = for_verify(tmp)
    r = verify(paths)
    check_eq((r.returncode, r.stdout + r.stderr), (0, ""), "systemd-analyze verify on the units")
    # The same check on a broken copy must complain, or it proves nothing.
    with open(paths[0], "a") as f:
        f.write("NoSuchDirective=1\n")
    text = open(paths[1]).read().replace("ListenStream=", "ListenStreamm=")
    with open(paths[1], "w") as f:
        f.write(text)
    r = verify(paths)
    out = r.stdout + r.stderr
    check("NoSuchDirective" in out and "ListenStreamm" in out, f"verify flags a broken copy: {out}")
    shutil.rmtree(tmp)


def default_of(name):
    out = subprocess.run([DAEMON, "--config=", "--print-config"], capture_output=True,
                         text=True, check=True, env=daemon_env()).stdout
    return re.search(rf"^{name}\s+(\S*)", out, re.M).group(1)


def test_service_and_socket_contents():
    svc = parse_unit(os.path.join(UNITS, "gradsyncd.service"))
    sock = parse_unit(os.path.join(UNITS, "gradsyncd.socket"))
    want = {"Type": ["notify"], "NotifyAccess": ["main"], "Restart": ["on-failure"],
            "RestartPreventExitStatus": ["2"],
            "RuntimeDirectory": ["gradsync"], "RuntimeDirectoryPreserve": ["yes"],
            "NoNewPrivileges": ["yes"], "ProtectSystem": ["strict"], "DevicePolicy": ["closed"],
            "User": ["gradsync"], "Group": ["gradsync"]}
    for key, value in want.items():
        check_eq(svc.get(("Service", key)), value, f"[Service] {key}")
    allowed = svc.get(("Service", "DeviceAllow"), [])
    check(any(a.startswith("char-nvidia") and a.endswith(" rw") for a in allowed),
          f"the NVIDIA devices stay reachable: {allowed}")
    check(("Service", "PrivateDevices") not in svc, "PrivateDevices would hide the GPUs")
    exec_start = svc[("Service", "ExecStart")][0]
    check(exec_start.endswith("/sbin/gradsyncd") and os.path.isabs(exec_start),
          f"ExecStart {exec_start}")
    # The socket unit's socket is the daemon's default one, in the service's
    # runtime directory, for the group gradsyncd lets in.
    listen = sock[("Socket", "ListenStream")][0]
    check_eq(listen, default_of("socket"), "ListenStream is gradsyncd's default socket")
    check_eq(os.path.dirname(listen), "/run/" + svc[("Service", "RuntimeDirectory")][0],
             "the socket lies in the RuntimeDirectory")
    check_eq(sock[("Socket", "SocketGroup")], [default_of("group") or "gradsync"],
             "SocketGroup is gradsyncd's --group")
    check_eq(sock[("Socket", "SocketMode")], ["0660"], "SocketMode")
    check_eq(sock.get(("Socket", "Accept"), ["no"]), ["no"], "one daemon for all connections")


def test_sysusers_creates_user_and_group():
    if not shutil.which("systemd-sysusers"):
        raise Skip("systemd-sysusers is not installed (package systemd)")
    root = tempfile.mkdtemp(prefix="gs-sysusers-")
    os.makedirs(os.path.join(root, "etc"))
    for f in ["passwd", "group", "shadow", "gshadow"]:
        open(os.path.join(root, "etc", f), "w").close()
    r = subprocess.run(["systemd-sysusers", f"--root={root}",
                        os.path.join(UNITS, "gradsync.conf")], capture_output=True, text=True)
    check_eq(r.returncode, 0, f"systemd-sysusers: {r.stderr}")
    users = [l.split(":") for l in open(os.path.join(root, "etc", "passwd"))]
    groups = [l.split(":") for l in open(os.path.join(root, "etc", "group"))]
    user = [u for u in users if u[0] == "gradsync"]
    group = [g for g in groups if g[0] == "gradsync"]
    check(user and group, f"user and group gradsync: {users} {groups}")
    check_eq(user[0][3], group[0][2], "the user's primary group is gradsync")
    check(user[0][6].strip().endswith("nologin"), "no login shell")
    shutil.rmtree(root)


# ---- the unit's CPU scheduling reaches every thread ------------------------------

CHRT_POLICY = {"fifo": ("-f", 1), "rr": ("-r", 2)}  # chrt's flag, the kernel's number


def chrt_of_unit(svc):
    """The chrt command that starts a process as the unit's CPUScheduling*
    lines do, and the policy number every thread must then have."""
    policy = svc.get(("Service", "CPUSchedulingPolicy"), ["other"])[-1]
    check(policy in CHRT_POLICY, f"CPUSchedulingPolicy={policy}: a real-time policy")
    flag, number = CHRT_POLICY[policy]
    prio = svc.get(("Service", "CPUSchedulingPriority"), ["1"])[-1]
    reset = svc.get(("Service", "CPUSchedulingResetOnFork"), ["no"])[-1]
    argv = ["chrt", flag] + (["-R"] if reset in ("yes", "true", "1", "on") else []) + [prio]
    return argv, number


def thread_policies(pid):
    """{thread name: [policy, ...]} of every thread of pid, from
    /proc/PID/task/TID/stat (field 41, after the name in brackets)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        except FileNotFoundError:
            continue  # it ended meanwhile
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out.setdefault(name, []).append(int(fields[41 - 3]))
    return out


def test_unit_scheduling_reaches_every_thread():
    """The unit gives gradsyncd a real-time policy so that its wake-ups do
    not wait behind a busy neighbour (README, "CPU: priority and cores").
    It only works if every thread has it: the worker, the pack threads and
    Gloo's, made after start. A policy reset at every clone
    (CPUSchedulingResetOnFork=yes resets threads too) would leave all but
    the main thread ordinary. Two nodes of one trainer each, so that Gloo's
    threads exist too; the daemons started as the unit would start them."""
    if not HAVE_GLOO:
        raise Skip("built without Gloo: no job of two nodes")
    svc = parse_unit(os.path.join(UNITS, "gradsyncd.service"))
    prefix, want = chrt_of_unit(svc)
    probe = subprocess.run(prefix + ["true"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise Skip(f"{' '.join(prefix)} is not permitted here: {probe.stderr.strip()}")
    job = Job(nodes=2, local_size=1)
    daemons = [Daemon(job=job, node=n, prefix=prefix) for n in range(2)]
    try:
        trainers = [Trainer(d.socket, 0, [4096, 300000], steps=2, hold=True, log_dir=d.dir,
                            job=job, node=n) for n, d in enumerate(daemons)]
        for t in trainers:
            t.wait_line("HOLDING")
        for d in daemons:
            threads = thread_policies(d.proc.pid)
            for name in ["gs-worker", "gs-comm"]:
                check(name in threads, f"gradsyncd's thread {name} among {sorted(threads)}")
            wrong = {n: p for n, p in threads.items() if any(x != want for x in p)}
            check_eq(wrong, {}, f"threads of gradsyncd (started as {' '.join(prefix)}) "
                     f"without policy {want}")
        for t in trainers:
            t.release()
        for t in trainers:
            t.wait()
    finally:
        for d in daemons:
            d.cleanup()


if __name__ == "__main__":
    run([test_systemd_analyze_verify, test_service_and_socket_contents,
         test_sysusers_creates_user_and_group, test_unit_scheduling_reaches_every_thread])
