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

from opslib import BUILD, DAEMON, Skip, check, check_eq, daemon_env, run

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


if __name__ == "__main__":
    run([test_systemd_analyze_verify, test_service_and_socket_contents,
         test_sysusers_creates_user_and_group])
