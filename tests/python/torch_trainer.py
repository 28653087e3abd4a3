"""One trainer of the PyTorch comparison: the same small model trained on
the same synthetic data, its gradients synchronised by gradsync, by DDP on
Gloo, or not at all. Saves the final parameters and the largest gradient
seen (for the tolerance) to OUT.npz.

    torch_trainer.py gradsync RANK STEPS OUT --socket S --wire fp16|fp32
    torch_trainer.py half     RANK STEPS OUT --socket S    (backward_and_update_half)
    torch_trainer.py ddp      RANK STEPS OUT --init FILE --world 2 [--fp16-hook]
    torch_trainer.py local    RANK STEPS OUT
    torch_trainer.py figures  RANK STEPS OUT --socket S --clip C --inf-at STEP

"figures" checks what a loss scaler reads: GradSync clips at C and each
step's clipped count is compared with the local gradient's, computed
separately; at step STEP rank 0's loss is made infinite, and a step whose
reduced gradients hold non-finite values is skipped, as a scaler does.
"""
import copy
import argparse

import numpy as np
import torch

LR = 0.05
MOMENTUM = 0.9
THRESHOLD = 4096  # elements: the model's 22,538 parameters make several buckets


def make_model():
    torch.manual_seed(0)  # the same initial weights in every process
    return torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(),
                               torch.nn.Linear(128, 128), torch.nn.Tanh(),
                               torch.nn.Linear(128, 10))


def batch(rank, step):
    """This rank's synthetic batch for `step`: inputs and class labels."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(64, 32, generator=g)
    y = (x[:, :10].sum(dim=1) * 3).long().remainder(10)  # learnable labels
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["gradsync", "half", "ddp", "local", "figures"])
    ap.add_argument("rank", type=int)
    ap.add_argument("steps", type=int)
    ap.add_argument("out")
    ap.add_argument("--socket")
    ap.add_argument("--wire", default="fp16")
    ap.add_argument("--init")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--fp16-hook", action="store_true")
    ap.add_argument("--local-rank", type=int, help="the trainer's rank on its node "
                    "(default: RANK, all trainers on one node)")
    ap.add_argument("--clip", type=float)
    ap.add_argument("--inf-at", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)  # the same float operations in every process
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    net = model
    if a.mode == "gradsync":
        import gradsync.torch
        local_rank = a.rank if a.local_rank is None else a.local_rank
        gradsync.torch.GradSync(model, threshold=THRESHOLD, wire=a.wire, optimizer=opt,
                                socket_path=a.socket, local_rank=local_rank)
    elif a.mode == "half":
        import gradsync.torch
    elif a.mode == "figures":
        return figures(a, model, opt)
    elif a.mode == "ddp":
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        dist.init_process_group("gloo", init_method=f"file://{a.init}", rank=a.rank,
                                world_size=a.world)
        net = torch.nn.parallel.DistributedDataParallel(model)
        if a.fp16_hook:
            net.register_comm_hook(None, default_hooks.fp16_compress_hook)
    gmax = 0.0
    losses = []
    for step in range(1, a.steps + 1):
        x, y = batch(a.rank, step)
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        losses.append(loss.item())
        if a.mode == "half":
            gradsync.torch.backward_and_update_half(loss, opt, threshold=THRESHOLD,
                                                    socket_path=a.socket, local_rank=a.rank)
        else:
            loss.backward()
            opt.step()
        gmax = max(gmax, max(p.grad.abs().max().item() for p in model.parameters()))
    out = {f"p{i}": p.detach().numpy().copy() for i, p in enumerate(model.parameters())}
    np.savez(a.out, gmax=np.float64(gmax), losses=np.array(losses), **out)
    if a.mode == "ddp":
        # Left to the interpreter's exit, the group's Gloo threads are
        # torn down under it: "terminate called without an active
        # exception", and the process aborts after its work is done.
        torch.distributed.destroy_process_group()
    print(f"done: loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)


def figures(a, model, opt):
    import gradsync.torch
    sync = gradsync.torch.GradSync(model, threshold=THRESHOLD, wire="fp16",
                                   clip_value=a.clip, socket_path=a.socket, local_rank=a.rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    rows = []
    for step in range(1, a.steps + 1):
        x, y = batch(a.rank, step)
        scale = float("inf") if step == a.inf_at and a.rank == 0 else 1.0
        # The local gradient, from a copy of the model, before any sync.
        twin = copy.deepcopy(model)
        local = torch.autograd.grad(loss_fn(twin(x), y) * scale, list(twin.parameters()))
        want_clipped = sum(int(((g > a.clip) | (g < -a.clip)).sum()) for g in local)
        sync.zero_grad()
        (loss_fn(model(x), y) * scale).backward()
        r = sync.wait()
        skipped = r.nonfinite > 0
        if not skipped:
            opt.step()
        rows.append([step, r.clipped, want_clipped, r.nonfinite, int(skipped)])
    out = {f"p{i}": p.detach().numpy().copy() for i, p in enumerate(model.parameters())}
    np.savez(a.out, rows=np.array(rows, dtype=np.int64), **out)
    print("done", flush=True)


if __name__ == "__main__":
    main()
