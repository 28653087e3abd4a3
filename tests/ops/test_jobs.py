#!/usr/bin/env python3
"""Two jobs on one daemon, as gradsyncctl and the metrics show them: job 'a'
of root's with two trainers, job 'b' of another user's (nobody) with one,
each having run its own number of steps. `jobs` lists both with their
shapes, `status --job` shows one and names an id it cannot find, the
metrics carry each job's trainers and steps under its `job` label, and to
the other user root's job is hidden in status and absent from the
job-labelled metrics. Every expected figure is the test's own (the
trainers it started, the steps it asked for, the environment it gave)."""
import json
import os
import re
import shutil
import subprocess
import sys

from opslib import (BUILD, SOURCE, TRAINER, Daemon, Skip, Trainer, check, check_eq, ctl,
                    daemon_env, run, spawn)
from test_ctl import parse_exposition

COUNTS = [500, 700, 3000]
OTHER = 65534  # nobody
# job id -> (local size, steps, threshold, runs as)
JOBS = {"a": (2, 2, 1000, None), "b": (1, 3, 4000, OTHER)}


class JobTrainer(Trainer):
    """An ops-trainer that takes its job from the environment, as a
    launcher would leave it, possibly as another user; it holds its
    connection after its steps until released."""

    def __init__(self, sock, job, rank, log_dir):
        local_size, steps, threshold, user = JOBS[job]
        argv = [TRAINER, "--socket", sock, "--rank", str(rank),
                "--counts", ",".join(map(str, COUNTS)), "--steps", str(steps), "--hold"]
        if user is not None:
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + argv
        env = daemon_env({"GRADSYNC_JOB_ID": job, "GRADSYNC_LOCAL_SIZE": str(local_size),
                          "GRADSYNC_THRESHOLD": str(threshold)})
        self.log = os.path.join(log_dir, f"trainer-{job}-{rank}.log")
        self.proc = spawn(argv, self.log, env=env, stdin=subprocess.PIPE)


class TwoJobs:
    """The daemon (which lets the other user in) and both jobs' trainers,
    every one of them holding after its steps."""

    def __init__(self):
        if os.getuid() != 0 or not shutil.which("setpriv"):
            raise Skip("needs root and setpriv to run a job as another user")
        self.d = Daemon([f"--allow-uids={OTHER}"])
        # The other user must reach the socket: the test's directory is
        # closed to others, and gradsyncd without a group makes it 0600.
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.d.socket, 0o666)
        self.trainers = {job: [JobTrainer(self.d.socket, job, r, self.d.dir)
                               for r in range(JOBS[job][0])] for job in JOBS}
        for ts in self.trainers.values():
            for t in ts:
                t.wait_line("HOLDING")

    def finish(self):
        for ts in self.trainers.values():
            for t in ts:
                t.release()
        for job, ts in self.trainers.items():
            for t in ts:
                check_eq([s["status"] for s in t.wait()], ["OK"] * JOBS[job][1],
                         f"job {job}'s trainer's steps")
        self.d.cleanup()


def jobs_json(sock, user=None):
    return {j.get("job_id", "(hidden)"): j
            for j in json.loads(ctl(sock, "jobs", "--json", user=user).stdout)["jobs"]}


# One line of `gradsyncctl jobs`: JOB OWNER STATE TRAINERS NODE LOCAL WORLD
# STEPS LAST STEP; a state may hold spaces ("in step").
ROW = re.compile(r"^(\S+)\s+(\S+)\s+(.+?)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+(?: ms)?)$")


def jobs_table(sock, user=None):
    lines = ctl(sock, "jobs", user=user).stdout.splitlines()
    check_eq(lines[0].split(), ["JOB", "OWNER", "STATE", "TRAINERS", "NODE", "LOCAL", "WORLD",
                                "STEPS", "LAST", "STEP"], "the table's header")
    rows = {}
    for line in lines[1:]:
        m = ROW.match(line)
        check(m, f"a row of the table: '{line}'")
        rows.setdefault(m.group(1), []).append(m.groups())
    return rows


def job_samples(families, job):
    """Every sample, of any family, labelled with this job."""
    return [(n, l, v) for f in families.values() for n, l, v in f["samples"]
            if l.get("job") == job]


def sample(families, name, **labels):
    got = [v for f in families.values() for n, l, v in f["samples"]
           if n == name and l == labels]
    check_eq(len(got), 1, f"samples of {name}{labels}")
    return got[0]


def test_jobs_lists_both_with_their_shapes():
    jobs = TwoJobs()
    try:
        rows = jobs_table(jobs.d.socket)
        check_eq(sorted(rows), ["a", "b"], "the jobs listed")
        for job, (local, steps, _, user) in JOBS.items():
            (row,) = rows[job]
            owner = "root" if user is None else "nobody"
            check_eq((row[1], row[3], row[4], row[5], row[6], row[7]),
                     (owner, str(local), "0/1", str(local), str(local), str(steps)),
                     f"job {job}'s owner, trainers, node, local and world size, steps")
            check(re.match(r"^\d+\.\d\d ms$", row[8]), f"job {job}'s last step: {row[8]}")
        js = jobs_json(jobs.d.socket)
        for job, (local, steps, threshold, user) in JOBS.items():
            j = js[job]
            check_eq((j["hidden"], j["owner_uid"], j["local_size"], j["world_size"], j["nodes"],
                      j["node_rank"], j["trainers_connected"], j["steps_completed"],
                      j["current_step"], j["settings"]["threshold"], j["coordinator"]),
                     (False, user or 0, local, local, 1, 0, local, steps, steps, threshold, ""),
                     f"job {job} in jobs --json")
            # setpriv execs the trainer: its pid is the trainer's.
            check_eq(sorted(t["pid"] for t in j["trainers"]),
                     sorted(t.proc.pid for t in jobs.trainers[job]), f"job {job}'s trainers' pids")
        jobs.finish()
    finally:
        jobs.d.cleanup()


def test_status_of_one_job_and_of_none():
    jobs = TwoJobs()
    try:
        text = ctl(jobs.d.socket, "status", "--job", "a").stdout
        check("Job 'a'" in text and "Job 'b'" not in text, f"status --job a shows a only:\n{text}")
        check(re.search(r"shape:\s+node 0 of 1, local size 2, world size 2", text),
              f"job a's shape:\n{text}")
        check(re.search(r"steps:\s+2 completed, 0 aborted", text), f"job a's steps:\n{text}")
        check(re.search(r"threshold 1000 elements", text), f"job a's threshold:\n{text}")
        j = json.loads(ctl(jobs.d.socket, "status", "--job", "b", "--json").stdout)
        check_eq((j["job_id"], j["owner_uid"], j["local_size"], j["steps_completed"]),
                 ("b", OTHER, 1, 3), "status --job b --json")
        r = ctl(jobs.d.socket, "status", "--job", "nope", check_rc=1)
        check("'nope'" in r.stderr, f"the message names the id: {r.stderr}")
        check_eq(r.stdout, "", "nothing on stdout for a job that is not there")
        # The whole status shows the node, then both jobs.
        text = ctl(jobs.d.socket, "status").stdout
        check(re.search(r"jobs:\s+2 of 16\b", text), f"jobs n of max:\n{text}")
        check("Job 'a'" in text and "Job 'b'" in text, f"both jobs in status:\n{text}")
        s = json.loads(ctl(jobs.d.socket, "status", "--json").stdout)
        check_eq(sorted(j["job_id"] for j in s["jobs"]), ["a", "b"], "status --json's jobs")
        check_eq(s["max_jobs"], 16, "max_jobs")
        check_eq(s["steps_completed"], 2 + 3, "the node's steps, every job's")
        jobs.finish()
    finally:
        jobs.d.cleanup()


def test_metrics_per_job():
    jobs = TwoJobs()
    try:
        fam = parse_exposition(ctl(jobs.d.socket, "metrics").stdout)
        for job, (local, steps, _, _) in JOBS.items():
            check_eq(sample(fam, "gradsync_trainers", job=job), local, f"trainers of {job}")
            check_eq(sample(fam, "gradsync_job_steps_total", job=job), steps, f"steps of {job}")
            check_eq(sample(fam, "gradsync_local_size", job=job), local, f"local size of {job}")
        check_eq(sample(fam, "gradsync_jobs"), 2, "jobs of the node")
        check_eq(sample(fam, "gradsync_steps_total"), 2 + 3, "the node's steps")
        jobs.finish()
    finally:
        jobs.d.cleanup()


def test_another_users_job_is_hidden():
    jobs = TwoJobs()
    try:
        sock = jobs.d.socket
        # nobody owns b and sees it; root's a is hidden to it.
        s = json.loads(ctl(sock, "status", "--json", user=OTHER).stdout)
        shown = {j.get("job_id"): j for j in s["jobs"] if not j["hidden"]}
        hidden = [j for j in s["jobs"] if j["hidden"]]
        check_eq(sorted(shown), ["b"], "the jobs nobody sees")
        check_eq(len(hidden), 1, "one hidden job")
        check_eq(sorted(hidden[0]), ["hidden", "state", "trainers_connected"],
                 "a hidden job's fields")
        check_eq(hidden[0]["trainers_connected"], 2, "the hidden job's trainers")
        text = ctl(sock, "status", user=OTHER).stdout
        check(re.search(r"^another user's job: .+, 2 trainers$", text, re.M),
              f"the hidden job in status:\n{text}")
        check("Job 'a'" not in text and "Job 'b'" in text, f"nobody's status:\n{text}")
        rows = jobs_table(sock, user=OTHER)
        check_eq(sorted(rows), ["(hidden)", "b"], "the jobs nobody's table lists")
        check_eq(rows["(hidden)"][0][3], "2", "the hidden job's trainers in the table")
        r = ctl(sock, "status", "--job", "a", check_rc=1, user=OTHER)
        check("'a'" in r.stderr, f"job a is not nobody's to see: {r.stderr}")
        fam = parse_exposition(ctl(sock, "metrics", user=OTHER).stdout)
        check_eq(job_samples(fam, "a"), [], "job a in nobody's metrics")
        check_eq(sample(fam, "gradsync_trainers", job="b"), 1, "nobody's job b's trainers")
        # Root sees both.
        fam = parse_exposition(ctl(sock, "metrics").stdout)
        check(job_samples(fam, "a") and job_samples(fam, "b"), "root sees both jobs' series")
        jobs.finish()
    finally:
        jobs.d.cleanup()


def test_python_control_jobs():
    # A sanitized libgradsync cannot be loaded into a plain python (the
    # runtime must come first): the plain run checks this.
    if "ASAN_OPTIONS" in os.environ:
        raise Skip("the sanitizer run's libgradsync cannot load into a plain python")
    # The package is ctypes alone: this python3 loads it from the tree.
    sys.path.insert(0, os.path.join(SOURCE, "python"))
    os.environ["GRADSYNC_LIBRARY"] = os.path.join(BUILD, "client", "libgradsync.so")
    import gradsync.control
    jobs = TwoJobs()
    try:
        with gradsync.Control(jobs.d.socket) as c:
            got = {j.job_id: j for j in c.jobs()}
            d = c.status()
        check_eq(sorted(got), ["a", "b"], "Control.jobs()")
        for job, (local, steps, threshold, user) in JOBS.items():
            j = got[job]
            check(isinstance(j, gradsync.control.JobStatus), "a JobStatus")
            check_eq((j.hidden, j.owner_uid, j.local_size, j.world_size, j.trainers_connected,
                      len(j.trainers), j.steps_completed, j.threshold, j.wire_dtype, j.op),
                     (False, user or 0, local, local, local, local, steps, threshold, "fp16",
                      "average"), f"job {job} from Python")
            check_eq(sorted(t["pid"] for t in j.trainers),
                     sorted(t.proc.pid for t in jobs.trainers[job]), f"job {job}'s trainers")
        check_eq(sorted(j["job_id"] for j in d["jobs"]), ["a", "b"], "status()['jobs']")
        check_eq(d["max_jobs"], 16, "status()['max_jobs']")
        jobs.finish()
    finally:
        jobs.d.cleanup()


def test_no_jobs_and_usage():
    d = Daemon()
    try:
        check_eq(ctl(d.socket, "jobs").stdout.splitlines()[1:], [], "an idle daemon's jobs")
        check_eq(json.loads(ctl(d.socket, "jobs", "--json").stdout)["jobs"], [],
                 "an idle daemon's jobs --json")
        check(re.search(r"jobs:\s+0 of 16\n(.*\n)*\nno jobs\n$", ctl(d.socket, "status").stdout),
              "an idle daemon's status says it has no jobs")
        r = ctl(d.socket, "status", "--job", "", check_rc=1)
        check("no job ''" in r.stderr, f"the job without an id, absent: {r.stderr}")
        for args in (["--job", "a", "metrics"], ["--job", "a", "jobs"], ["status", "--job"],
                     ["jobs", "extra"], ["--json", "trace", "stop"]):
            r = ctl(d.socket, *args, check_rc=2)
            check("Try 'gradsyncctl --help'" in r.stderr, f"usage hint for {args}")
    finally:
        d.cleanup()


if __name__ == "__main__":
    run([test_jobs_lists_both_with_their_shapes, test_status_of_one_job_and_of_none,
         test_metrics_per_job, test_another_users_job_is_hidden, test_python_control_jobs,
         test_no_jobs_and_usage])
