#!/usr/bin/env python3
"""gradsyncd stops promptly on SIGTERM (exit 0 within STOP_LIMIT s),
whatever its jobs of several nodes are doing, with --job-linger far
longer than that (a job kept that long would hold the stop up):

  while_joining         a job of 2 nodes whose node 1 never comes, its
                        trainer still waiting to be welcomed;
  after_a_failed_join   the same job's trainer gone while it joined, and
                        then the join failed (--join-timeout): the job,
                        found by no Hello from then on, goes with its
                        threads at once, not --job-linger later;
  while_lingering       a job of 2 nodes whose trainers ran a step and
                        left: its group is kept for --job-linger, but a
                        daemon that stops keeps nothing.

One daemon, node 0 of each job, on loopback; node 1 is never started,
but for the lingering job (a job of one node has no group to keep)."""
import os
import time

from opslib import HAVE_GLOO, Daemon, Job, Skip, Trainer, check, check_eq, run, wait_for

STOP_LIMIT = 5
LINGER = 120
JOIN_TIMEOUT = 3
COUNTS = [1000, 300]


def stopped_promptly(d):
    t0 = time.monotonic()
    rc = d.stop(timeout=STOP_LIMIT + 15)
    took = time.monotonic() - t0
    print(f"gradsyncd stopped {took:.2f} s after SIGTERM, exit {rc}")
    check_eq(rc, 0, "gradsyncd's exit status")
    check(took < STOP_LIMIT, f"gradsyncd took {took:.2f} s to stop (limit {STOP_LIMIT} s): "
                             f"{d.log_text()[-2000:]}")


def two_nodes(job_id):
    if not HAVE_GLOO:
        raise Skip("a job of several nodes needs Gloo")
    job = Job(job_id=job_id, nodes=2)
    d = Daemon([f"--job-linger={LINGER}", f"--join-timeout={JOIN_TIMEOUT}"], job=job)
    return job, d


def test_while_joining():
    job, d = two_nodes("joining")
    try:
        t = Trainer(d.socket, 0, COUNTS, job=job)
        wait_for(lambda: "joining the rendezvous" in d.log_text(), 10, "the job to begin")
        stopped_promptly(d)
        t.proc.wait(timeout=30)
    finally:
        d.cleanup()


def threads(d):
    return len(os.listdir(f"/proc/{d.proc.pid}/task"))


def test_after_a_failed_join():
    job, d = two_nodes("refused")
    try:
        idle = threads(d)
        t = Trainer(d.socket, 0, COUNTS, job=job)
        wait_for(lambda: "joined job 'refused' as local rank 0" in d.log_text(), 10,
                 "the trainer to join the job")
        t.proc.kill()
        t.proc.wait(timeout=10)
        wait_for(lambda: "left job 'refused'" in d.log_text(), 10, "the trainer to leave")
        wait_for(lambda: "cannot join the job" in d.log_text(), JOIN_TIMEOUT + 10,
                 "the join to fail")
        # Gone with its threads (its worker's), not kept --job-linger.
        wait_for(lambda: threads(d) == idle, STOP_LIMIT,
                 f"the refused job's threads to go ({idle} threads before it)")
        stopped_promptly(d)
    finally:
        d.cleanup()


def test_while_lingering():
    if not HAVE_GLOO:
        raise Skip("a job of several nodes needs Gloo")
    job = Job(job_id="kept", nodes=2)
    d = Daemon([f"--job-linger={LINGER}"], job=job)
    d1 = Daemon([f"--job-linger={LINGER}"], job=job, node=1)
    try:
        trainers = [Trainer(n.socket, 0, COUNTS, job=job, node=i) for i, n in enumerate([d, d1])]
        for t in trainers:
            check_eq(len(t.wait()), 1, "the trainer's steps")
        wait_for(lambda: "keeping its group" in d.log_text(), 10, "the job to linger")
        stopped_promptly(d)
    finally:
        d1.cleanup()
        d.cleanup()


if __name__ == "__main__":
    run([test_while_joining, test_after_a_failed_join, test_while_lingering])
