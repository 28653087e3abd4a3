"""A trainer process for the Python tests: registers tensors of the given
sizes through the gradsync package, runs steps on inputs from
inputs(rank, step, counts) and saves what came back.

    numpy_trainer.py SOCKET RANK COUNTS STEPS OUT.npz [--clip V] [--nan]
                     [--hold-at STEP]

--nan puts a NaN into tensor 0 of rank 0 at every step; --hold-at STEP
stops after marking half the tensors of that step and sleeps (the test
kills it there).
"""
import argparse
import sys
import time

import numpy as np

import gradsync


def inputs(rank, step, count, t):
    """Trainer `rank`'s gradient of tensor t at `step`: normal values at
    several magnitudes, so that rounding, subnormals and large values all
    occur."""
    rng = np.random.default_rng([rank, step, t])
    scale = np.float32(10.0) ** rng.integers(-6, 4, size=count)
    return (rng.standard_normal(count).astype(np.float32) * scale).astype(np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket")
    ap.add_argument("rank", type=int)
    ap.add_argument("counts")
    ap.add_argument("steps", type=int)
    ap.add_argument("out")
    ap.add_argument("--clip", type=float)
    ap.add_argument("--nan", action="store_true")
    ap.add_argument("--hold-at", type=int, default=0)
    a = ap.parse_args()
    counts = [int(c) for c in a.counts.split(",")]
    saved = {}
    with gradsync.Client(a.socket, local_rank=a.rank, timeout=30) as client:
        grads = client.register([(f"t{i}", c) for i, c in enumerate(counts)])
        print("registered", client.bucket_count, flush=True)
        for step in range(1, a.steps + 1):
            with client.step(clip_value=a.clip, timeout=60) as s:
                for t, c in enumerate(counts):
                    grads[t][:] = inputs(a.rank, step, c, t)
                    if a.nan and a.rank == 0 and t == 0:
                        grads[t][0] = np.nan
                    s.mark_ready([t])
                    if step == a.hold_at and t == len(counts) // 2:
                        print("holding", flush=True)
                        time.sleep(3600)
            r = s.result
            for t in range(len(counts)):
                saved[f"s{step}t{t}"] = grads[t].copy()
            saved[f"s{step}result"] = np.array([r.step, r.buckets, r.wire_bytes, r.clipped,
                                                r.nonfinite], dtype=np.uint64)
    np.savez(a.out, **saved)
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
