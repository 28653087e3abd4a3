"""One trainer of test_torch_norm: after each step's wait, compares
GradSync.clip_grad_norm_ with torch.nn.utils.clip_grad_norm_ applied to a
copy of the same reduced gradients, and the step's grad_norm with an
fp64 norm computed here with NumPy. Saves the figures of every step and
the final parameters to OUT.npz.

    norm_trainer.py RANK STEPS OUT --socket S --wire W --inf-at STEP

At step STEP (0: never) rank 0's loss is made infinite: the norm must be
inf or NaN as torch's is, and error_if_nonfinite must raise as torch's
does; the step is then skipped. Odd steps clip at a max_norm a tenth of
the norm (the scaling is tested), even steps at ten times it (nothing
may change); every third step asks for norm_type 1, which falls back to
torch's function.
"""
import argparse
import copy
import math

import numpy as np
import torch

from torch_trainer import LR, MOMENTUM, THRESHOLD, batch, make_model


def fp64_norm(grads):
    """The L2 norm of the gradients' float32 values, summed in float64."""
    return math.sqrt(sum(float(np.sum(g.detach().numpy().astype(np.float64) ** 2))
                         for g in grads))


def rel(a, b):
    return abs(a - b) / abs(b) if b else abs(a - b)


def max_ulps(ours, theirs):
    """The largest difference between two lists of tensors, in units of
    the float32 rounding of the larger magnitude (0 when equal)."""
    worst = 0.0
    for a, b in zip(ours, theirs):
        d = (a - b).abs()
        scale = torch.maximum(a.abs(), b.abs()).clamp(min=torch.finfo(torch.float32).tiny)
        worst = max(worst, float((d / (scale * 2.0 ** -24)).max()))
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rank", type=int)
    ap.add_argument("steps", type=int)
    ap.add_argument("out")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--wire", default="fp16")
    ap.add_argument("--inf-at", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    import gradsync.torch
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sync = gradsync.torch.GradSync(model, threshold=THRESHOLD, wire=a.wire,
                                   socket_path=a.socket, local_rank=a.rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    rows = []
    for step in range(1, a.steps + 1):
        x, y = batch(a.rank, step)
        scale = float("inf") if step == a.inf_at and a.rank == 0 else 1.0
        sync.zero_grad()
        (loss_fn(model(x), y) * scale).backward()
        r = sync.wait()
        params = list(model.parameters())
        reduced = [p.grad.clone() for p in params]
        reference = fp64_norm(reduced)
        # torch's clip on a copy of the same reduced gradients.
        twin = copy.deepcopy(model)
        for p, g in zip(twin.parameters(), reduced):
            p.grad = g.clone()
        norm_type = 1.0 if step % 3 == 0 else 2.0
        if step == a.inf_at:
            errs = []
            for fn in (lambda: torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0,
                                                              error_if_nonfinite=True),
                       lambda: sync.clip_grad_norm_(1.0, error_if_nonfinite=True)):
                try:
                    fn()
                    errs.append("")
                except RuntimeError as e:
                    errs.append(str(e))
            theirs = torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
            ours = sync.clip_grad_norm_(1.0)
            rows.append([step, r.grad_norm, reference, float(ours), float(theirs), 0.0,
                         float(bool(errs[0]) and errs[0] == errs[1]), 1.0, norm_type])
            continue  # skipped, as a loss scaler does
        max_norm = reference / 10 if step % 2 else reference * 10
        theirs = torch.nn.utils.clip_grad_norm_(twin.parameters(), max_norm, norm_type)
        ours = sync.clip_grad_norm_(max_norm, norm_type)
        ulps = max_ulps([p.grad for p in params], [p.grad for p in twin.parameters()])
        unchanged = all(torch.equal(p.grad, g) for p, g in zip(params, reduced))
        rows.append([step, r.grad_norm, reference, float(ours), float(theirs), ulps, 0.0,
                     float(unchanged), norm_type])
        opt.step()
    out = {f"p{i}": p.detach().numpy().copy() for i, p in enumerate(model.parameters())}
    np.savez(a.out, rows=np.array(rows, dtype=np.float64), **out)
    sync.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
