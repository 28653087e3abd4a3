#!/usr/bin/env python3
"""gradsyncctl against a real daemon and real trainers: status --json and
metrics (parsed as the Prometheus text exposition format) checked against
figures this test computes itself after known steps, an aborted step,
clients, and the exit codes scripts rely on."""
import json
import math
import os
import re
import shutil
import socket
import tempfile

import opslib
from opslib import (Daemon, Skip, Trainer, check, check_eq, clipped, ctl, plan, run, status,
                    wait_for)

COUNTS = [500, 700, 3000, 200, 900, 100, 64]
THRESHOLD = 1000
STEPS = 3
CLIP = 1.0
# The job of every test here: two trainers, given it in their environment.
JOB = opslib.Job(local_size=2, threshold=THRESHOLD, fusion_buffer=1024)


# ---- the exposition format, parsed here -----------------------------------------

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: (-?\d+))?$")
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"\s*(,|$)')
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse_labels(text):
    labels, pos = {}, 0
    while pos < len(text):
        m = LABEL.match(text, pos)
        check(m, f"label syntax at '{text[pos:]}'")
        check(m.group(1) not in labels, f"label {m.group(1)} twice")
        labels[m.group(1)] = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1),
                                    m.group(2))
        pos = m.end()
    return labels


def parse_value(text):
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf"))
    check(re.match(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$", text), f"value '{text}'")
    return float(text)


def family_of(name, families):
    if name in families:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and families.get(base, {}).get("type") == "histogram":
            return base
    return None


def parse_exposition(text):
    """{family: {"type", "help", "samples": [(name, labels, value)]}}, checking
    the format: HELP and TYPE once, before the family's samples, which are
    contiguous; valid names, labels and values; a final line feed."""
    check(text.endswith("\n"), "the text ends with a line feed")
    families, current, done = {}, None, set()
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(" ", 3)
            check(len(parts) == 4, f"'{line}'")
            kind, name, rest = parts[1], parts[2], parts[3]
            f = families.setdefault(name, {"samples": []})
            check(kind.lower() not in f, f"{kind} of {name} twice")
            check(not f["samples"], f"{kind} of {name} after its samples")
            if kind == "TYPE":
                check(rest in TYPES, f"type '{rest}' of {name}")
                f["type"] = rest
            else:
                f["help"] = rest
            continue
        if line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        check(m, f"sample line '{line}'")
        name = m.group(1)
        fam = family_of(name, families)
        check(fam and "type" in families[fam], f"sample {name} has a TYPE line before it")
        if fam != current:
            check(fam not in done, f"samples of {fam} are not contiguous")
            if current:
                done.add(current)
            current = fam
        families[fam]["samples"].append((name, parse_labels(m.group(2) or ""),
                                         parse_value(m.group(3))))
    for name, f in families.items():
        if f.get("type") == "counter":
            check(name.endswith("_total"), f"counter {name} ends in _total")
        if f.get("type") == "histogram":
            check_histogram(name, f["samples"])
    return families


def check_histogram(name, samples):
    buckets = [(s[1]["le"], s[2]) for s in samples if s[0] == name + "_bucket"]
    count = [s[2] for s in samples if s[0] == name + "_count"]
    total = [s[2] for s in samples if s[0] == name + "_sum"]
    check(buckets and len(count) == 1 and len(total) == 1, f"{name}: buckets, _sum and _count")
    check_eq(buckets[-1][0], "+Inf", f"{name}'s last bucket")
    bounds = [parse_value(le) for le, _ in buckets]
    check(bounds == sorted(bounds) and len(set(bounds)) == len(bounds), f"{name}'s le increase")
    counts = [v for _, v in buckets]
    check(counts == sorted(counts), f"{name}'s buckets are cumulative: {counts}")
    check_eq(counts[-1], count[0], f"{name}: +Inf bucket equals _count")
    check(total[0] >= 0, f"{name}_sum")


def value(families, name, **labels):
    fam = family_of(name, families)
    check(fam, f"a family for {name}")
    got = [v for n, l, v in families[fam]["samples"] if n == name and all(
        l.get(k) == w for k, w in labels.items())]
    check_eq(len(got), 1, f"samples of {name}{labels}")
    return got[0]


# ---- tests -----------------------------------------------------------------------

class Job:
    """A daemon and two trainers that ran STEPS known steps and stay
    connected."""

    def __init__(self):
        self.d = Daemon(job=JOB)
        self.trainers = [Trainer(self.d.socket, r, COUNTS, steps=STEPS, clip=CLIP, nan=True,
                                 hold=True, log_dir=self.d.dir, job=JOB) for r in range(2)]
        for t in self.trainers:
            t.wait_line("HOLDING")
        self.buckets = plan(COUNTS, THRESHOLD)
        self.elements = sum(COUNTS)
        self.clipped = [clipped(r, COUNTS, CLIP, nan=True) for r in range(2)]

    def finish(self):
        for t in self.trainers:
            t.release()
        results = [t.wait() for t in self.trainers]
        self.d.cleanup()
        return results


def test_status_json_after_known_steps():
    job = Job()
    try:
        s = status(job.d.socket)
        check_eq(s["steps_completed"], STEPS, "steps completed")
        check_eq(s["steps_aborted"], 0, "steps aborted")
        check_eq(s["current_step"], STEPS, "current step")
        check_eq(s["buckets"], len(job.buckets), "buckets of the plan")
        check_eq(s["buckets_in_flight"], 0, "buckets in flight")
        check_eq(s["bytes_reduced"], STEPS * job.elements * 2, "bytes reduced (fp16)")
        check_eq(s["elements_clipped"], STEPS * sum(job.clipped), "elements clipped")
        check_eq(s["nonfinite"], STEPS, "non-finite values (one NaN a step)")
        check(0 < s["median_step_ns"] < 60e9 and 0 < s["last_step_ns"] < 60e9, "step times")
        check_eq((s["local_size"], s["world_size"], s["nodes"], s["node_rank"]), (2, 2, 1, 0),
                 "node figures")
        check_eq(s["settings"]["threshold"], THRESHOLD, "threshold")
        check_eq(s["settings"]["wire_dtype"], "fp16", "wire")
        check_eq(s["settings"]["predivide_factor"], 2, "predivide (the world)")
        tr = sorted(s["trainers"], key=lambda t: t["local_rank"])
        check_eq([t["local_rank"] for t in tr], [0, 1], "trainers' local ranks")
        for t, proc in zip(tr, job.trainers):
            check_eq((t["pid"], t["uid"], t["tensors"], t["bytes"], t["steps"]),
                     (proc.proc.pid, os.getuid(), len(COUNTS), job.elements * 4, STEPS),
                     f"trainer {t['local_rank']}")
        results = job.finish()
        for r, steps in enumerate(results):
            check_eq(len(steps), STEPS, f"trainer {r}'s steps")
            for st in steps:
                check_eq((st["status"], int(st["buckets"]), int(st["wire"]), int(st["clipped"]),
                          int(st["nonfinite"])),
                         ("OK", len(job.buckets), job.elements * 2, job.clipped[r], 1),
                         f"trainer {r} step {st['step']}")
    finally:
        job.d.cleanup()


def test_metrics_after_known_steps_and_an_abort():
    job = Job()
    try:
        fam = parse_exposition(ctl(job.d.socket, "metrics").stdout)
        check_eq(value(fam, "gradsync_steps_total"), STEPS, "steps")
        check_eq(value(fam, "gradsync_steps_aborted_total"), 0, "aborted steps")
        check_eq(value(fam, "gradsync_step_duration_seconds_count"), STEPS, "histogram count")
        check_eq(value(fam, "gradsync_step_duration_seconds_bucket", le="60"), STEPS,
                 "steps under a minute")
        check(value(fam, "gradsync_step_duration_seconds_sum") > 0, "histogram sum")
        check_eq(value(fam, "gradsync_wire_bytes_total", dtype="fp16"),
                 STEPS * job.elements * 2, "fp16 bytes")
        check_eq(value(fam, "gradsync_wire_bytes_total", dtype="bf16"), 0, "bf16 bytes")
        check_eq(value(fam, "gradsync_wire_bytes_total", dtype="fp32"), 0, "fp32 bytes")
        check_eq(value(fam, "gradsync_buckets"), len(job.buckets), "buckets")
        check_eq(value(fam, "gradsync_buckets_reduced_total"), STEPS * len(job.buckets),
                 "buckets reduced")
        check_eq(value(fam, "gradsync_clipped_elements_total"), STEPS * sum(job.clipped),
                 "clipped")
        check_eq(value(fam, "gradsync_nonfinite_values_total"), STEPS, "non-finite")
        check_eq(value(fam, "gradsync_trainers"), 2, "trainers")
        check_eq(value(fam, "gradsync_peer_up", node="0"), 1, "this node is up")
        check_eq(value(fam, "gradsync_peer_trainers", node="0"), 2, "this node's trainers")
        check_eq(value(fam, "gradsync_info", backend="host"), 1, "info")
        check_eq(value(fam, "gradsync_job_info", backend="host", wire="fp16", op="average"), 1,
                 "the job's info")
        check_eq(value(fam, "gradsync_jobs"), 1, "jobs")
        for phase in ["wait_for_gradients", "queue", "pack", "allreduce", "unpack"]:
            v = value(fam, "gradsync_bucket_phase_seconds_total", phase=phase)
            check(v >= 0 and math.isfinite(v), f"{phase} seconds")
        check(value(fam, "gradsync_bucket_phase_seconds_total", phase="pack") > 0, "pack time")
        job.finish()

        # A new job whose step is aborted: rank 1 marks everything, rank 0
        # marks one tensor and exits.
        d = Daemon(job=JOB)
        job.d = d
        t1 = Trainer(d.socket, 1, COUNTS, steps=1, log_dir=d.dir, job=JOB)
        t1.wait_line("MARKED 1")
        t0 = Trainer(d.socket, 0, COUNTS, steps=1, abandon_at=1, log_dir=d.dir, job=JOB)
        t0.wait_line("ABANDON 1")
        check_eq(t1.wait()[0]["status"], "ABORTED", "the step of the trainer left alone")
        t0.wait()
        wait_for(lambda: status(d.socket)["steps_aborted"] == 1, 10, "the abort in the status")
        fam = parse_exposition(ctl(d.socket, "metrics").stdout)
        check_eq(value(fam, "gradsync_steps_aborted_total"), 1, "aborted steps")
        check_eq(value(fam, "gradsync_steps_total"), 0, "completed steps")
        check_eq(value(fam, "gradsync_step_duration_seconds_count"), 0, "histogram count")
    finally:
        job.d.cleanup()


def test_clients():
    job = Job()
    try:
        out = json.loads(ctl(job.d.socket, "clients", "--json").stdout)["clients"]
        trainers = sorted((c for c in out if c["role"] == "trainer"), key=lambda c: c["local_rank"])
        controls = [c for c in out if c["role"] == "control"]
        check_eq(len(out), 3, f"connections listed: {out}")
        check_eq([(c["local_rank"], c["pid"], c["uid"], c["tensors"], c["bytes"], c["steps"])
                  for c in trainers],
                 [(r, job.trainers[r].proc.pid, os.getuid(), len(COUNTS), job.elements * 4, STEPS)
                  for r in range(2)], "the trainers")
        check_eq(len(controls), 1, "one control connection")
        check(controls[0]["self"] and controls[0]["local_rank"] is None, "the asker, marked")
        check(not any(c["self"] for c in trainers), "trainers are not the asker")
        check_eq([c["id"] for c in out], sorted(c["id"] for c in out), "oldest first")
        text = ctl(job.d.socket, "clients").stdout
        lines = text.splitlines()
        check(lines[0].split()[:3] == ["ID", "ROLE", "PID"], f"header: {lines[0]}")
        check_eq(len(lines), 4, "a line per connection")
        check("(this gradsyncctl)" in text, "the asker is marked")
        for t in job.trainers:
            check(re.search(rf"\btrainer\s+{t.proc.pid}\b", text), f"trainer {t.proc.pid} listed")
        job.finish()
    finally:
        job.d.cleanup()


def test_exit_codes():
    tmp = tempfile.mkdtemp(prefix="gs-ctl-")
    absent = os.path.join(tmp, "absent.sock")
    for cmd in (["status"], ["status", "--json"], ["clients"], ["metrics"], ["trace", "stop"]):
        r = ctl(absent, *cmd, check_rc=3)
        check(absent in r.stderr and "running" in r.stderr, f"'not running' message: {r.stderr}")
    # A socket file left by a daemon that died.
    stale = os.path.join(tmp, "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)
    s.close()
    ctl(stale, "status", check_rc=3)
    for args in ([], ["bogus"], ["trace"], ["trace", "start"], ["trace", "pause"],
                 ["status", "extra"], ["--json", "metrics"], ["--timeout", "0", "status"],
                 ["--no-such-option", "status"], ["trace", "stop", "now"]):
        r = ctl(absent, *args, check_rc=2)
        check("Try 'gradsyncctl --help'" in r.stderr, f"usage hint for {args}")
    check("Exit status" in ctl(None, "--help").stdout, "--help describes the exit status")
    ctl(None, "--version")
    shutil.rmtree(tmp)


def test_permission_denied():
    if os.getuid() != 0 or not shutil.which("setpriv"):
        raise Skip("needs root and setpriv to run gradsyncctl as another user")
    d = Daemon()
    try:
        # The socket's directory is the test's, closed to others.
        os.chmod(d.dir, 0o700)
        r = ctl(d.socket, "status", check_rc=4, user=65534)
        check("Permission denied" in r.stderr, f"message: {r.stderr}")
        # Reachable, but gradsyncd refuses a user outside its group.
        os.chmod(d.dir, 0o755)
        os.chmod(d.socket, 0o666)
        r = ctl(d.socket, "status", check_rc=4, user=65534)
        check("refused" in r.stderr and "65534" in r.stderr, f"message: {r.stderr}")
        ctl(d.socket, "status")  # root still may
    finally:
        d.cleanup()


if __name__ == "__main__":
    run([test_status_json_after_known_steps, test_metrics_after_known_steps_and_an_abort,
         test_clients, test_exit_codes, test_permission_denied])
