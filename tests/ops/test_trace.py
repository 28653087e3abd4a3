#!/usr/bin/env python3
"""gradsyncctl trace start FILE / trace stop against real steps: the file
parses as JSON (the Trace Event Format) with exactly one complete event per
phase of each bucket (and of each chunk of a bucket larger than the fusion
buffer), in an order that makes sense; refusals leave files alone; the
file is opened as the caller, who must be able to write it."""
import json
import os
import re
import shutil
import tempfile
import time

from opslib import (Daemon, Job, Skip, Trainer, check, check_eq, ctl, plan, run)

COUNTS = [500, 700, 3000, 200, 900, 100, 64]
THRESHOLD = 1000
FUSION = 1024
# The job of every test here: two trainers, given it in their environment.
JOB = Job(local_size=2, threshold=THRESHOLD, fusion_buffer=FUSION)
EPS = 1.0  # microseconds: wall-clock ts near 1.7e15 are doubles 0.25 apart


def job(d, steps):
    ts = [Trainer(d.socket, r, COUNTS, steps=steps, log_dir=d.dir, job=JOB) for r in range(2)]
    for t in ts:
        t.wait()


def load(path):
    with open(path) as f:
        events = json.load(f)
    check(isinstance(events, list), "the trace is a JSON array")
    return events


def check_trace(events, steps, t0, t1):
    """Every bucket of every traced step, phase by phase, against the plan
    this test computes."""
    buckets = plan(COUNTS, THRESHOLD)
    complete = [e for e in events if e.get("ph") == "X"]
    meta = [e for e in events if e.get("ph") == "M"]
    check(any(e["name"] == "process_name" and "node 0" in e["args"]["name"] for e in meta),
          "the process is named after the node")
    named = {e["tid"] for e in meta if e["name"] == "thread_name"}
    check_eq(named, set(range(len(buckets))), "a named row per bucket")
    seen = sorted({e["args"]["step"] for e in complete})
    check_eq(len(seen), steps, f"traced steps {seen}")
    check_eq(seen, list(range(seen[0], seen[0] + steps)), "consecutive steps")
    by = {}
    for e in complete:
        a = e["args"]
        check_eq((e["pid"], e["tid"], e["cat"]), (0, a["bucket"], "bucket"), f"event {e}")
        check(t0 <= e["ts"] and e["ts"] + e["dur"] <= t1 and e["dur"] >= 0,
              f"event within the test's wall-clock time: {e}")
        key = (a["step"], a["bucket"], e["name"], a["chunk"])
        check(key not in by, f"one event for {key}")
        by[key] = e
    total = 0
    for step in seen:
        last_end = 0
        for b, elements in enumerate(buckets):
            chunks = -(-elements // FUSION)
            wait, queue = by[(step, b, "WAIT_FOR_GRADIENTS", 0)], by[(step, b, "QUEUE", 0)]
            check(abs(wait["ts"] + wait["dur"] - queue["ts"]) <= EPS, "queue follows the wait")
            prev = queue["ts"] + queue["dur"]
            # Buckets run in plan order on one worker: after the last one.
            prev = max(prev, last_end)
            for c in range(chunks):
                size = min(FUSION, elements - c * FUSION)
                for phase in ["PACK", "ALLREDUCE", "UNPACK"]:
                    e = by[(step, b, phase, c)]
                    check_eq((e["args"]["chunks"], e["args"]["elements"]), (chunks, size),
                             f"step {step} bucket {b} {phase} chunk {c}")
                    check(e["ts"] + EPS >= prev, f"{phase} of step {step} bucket {b} chunk {c} "
                                                 f"starts after the phase before it")
                    prev = e["ts"] + e["dur"]
            last_end = prev
            total += 2 + 3 * chunks
    check_eq(len(complete), total, "complete events: 2 per bucket + 3 per chunk, nothing else")
    return total


def test_trace_of_known_steps():
    d = Daemon(job=JOB)
    try:
        path = os.path.join(d.dir, "steps.json")
        job(d, 1)  # before the trace: not in it
        t0 = time.time() * 1e6
        out = ctl(d.socket, "trace", "start", path).stdout
        check(path in out and "trace stop" in out, f"start says where: {out}")
        check_eq(os.stat(path).st_size > 0, True, "the header is written at once")
        job(d, 3)
        # A second start, into the same file, is refused and leaves it alone.
        r = ctl(d.socket, "trace", "start", path, check_rc=1)
        check("already being written" in r.stderr, r.stderr)
        other = os.path.join(d.dir, "other.json")
        ctl(d.socket, "trace", "start", other, check_rc=1)
        check(not os.path.exists(other), "a refused start removes the file it created")
        out = ctl(d.socket, "trace", "stop").stdout
        t1 = time.time() * 1e6
        m = re.match(r"trace written to (.*): (\d+) events, (\d+) bytes", out)
        check(m and m.group(1) == path, f"stop says what it wrote: {out}")
        check_eq(int(m.group(3)), os.stat(path).st_size, "bytes written")
        events = load(path)
        total = check_trace(events, 3, t0, t1)
        check_eq(int(m.group(2)), total, "events reported")
        # Stopped: later steps are not traced, and stop again is refused.
        job(d, 1)
        check_eq(load(path), events, "nothing written after stop")
        r = ctl(d.socket, "trace", "stop", check_rc=1)
        check("no trace is being written" in r.stderr, r.stderr)
    finally:
        d.cleanup()


def test_trace_completed_at_shutdown():
    d = Daemon(job=JOB)
    try:
        path = os.path.join(d.dir, "t.json")
        t0 = time.time() * 1e6
        ctl(d.socket, "trace", "start", path)
        job(d, 2)
        check_eq(d.stop(), 0, "exit status")
        check_trace(load(path), 2, t0, time.time() * 1e6)
    finally:
        d.cleanup()


def test_bad_files_refused():
    d = Daemon(job=JOB)
    try:
        for path, why in [(os.path.join(d.dir, "no", "such", "dir.json"), "No such file"),
                          (d.dir, "Is a directory"), ("/dev/null", "not a regular file")]:
            r = ctl(d.socket, "trace", "start", path, check_rc=1)
            check("cannot write the trace to" in r.stderr and why in r.stderr, r.stderr)
        ctl(d.socket, "trace", "stop", check_rc=1)
    finally:
        d.cleanup()


def test_file_is_the_callers():
    if os.getuid() != 0 or not shutil.which("setpriv"):
        raise Skip("needs root and setpriv to run gradsyncctl as another user")
    d = Daemon(["--allow-uids=65534"], job=JOB)
    try:
        os.chmod(d.dir, 0o755)
        os.chmod(d.socket, 0o666)
        open_dir = tempfile.mkdtemp(prefix="gs-trace-open-")
        os.chmod(open_dir, 0o777)
        closed_dir = tempfile.mkdtemp(prefix="gs-trace-closed-")
        os.chmod(closed_dir, 0o700)
        # Where the caller may not write, the (root) daemon writes nothing.
        r = ctl(d.socket, "trace", "start", os.path.join(closed_dir, "t.json"), check_rc=1,
                user=65534)
        check("Permission denied" in r.stderr, r.stderr)
        check_eq(os.listdir(closed_dir), [], "nothing written where the caller may not")
        path = os.path.join(open_dir, "t.json")
        ctl(d.socket, "trace", "start", path, user=65534)
        job(d, 1)
        ctl(d.socket, "trace", "stop", user=65534)
        check_eq(os.stat(path).st_uid, 65534, "the file belongs to the caller")
        check(len(load(path)) > 0, "and holds the trace")
        shutil.rmtree(open_dir)
        shutil.rmtree(closed_dir)
    finally:
        d.cleanup()


if __name__ == "__main__":
    run([test_trace_of_known_steps, test_trace_completed_at_shutdown, test_bad_files_refused,
         test_file_is_the_callers])
