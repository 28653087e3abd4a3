"""One trainer of the state comparison: a small model with BatchNorm whose
replicas start apart (each rank seeds its own initial weights, as an
unseeded script would get), trained on the same synthetic data by GradSync
or by DDP on Gloo. Saves to OUT.npz the state right after wrapping
("init<i>"), the buffers each forward starts from ("fwd<step>_<j>", read
by a forward pre-hook that runs after the wrapper's broadcast), and the
final parameters ("p<i>").

    state_trainer.py gradsync RANK STEPS OUT --socket S --wire fp16|fp32 [--no-buffers]
    state_trainer.py ddp      RANK STEPS OUT --init FILE --world 2
"""
import argparse

import numpy as np
import torch

LR = 0.05
MOMENTUM = 0.9


def make_model(rank):
    """Rank `rank`'s initial replica: its own seed, so replicas differ."""
    torch.manual_seed(7 + 1000 * rank)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.BatchNorm1d(64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 4))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(32, 16, generator=g) * (1 + rank)  # ranks' statistics differ
    y = (x[:, :4].sum(dim=1) * 3).long().remainder(4)
    return x, y


def state_arrays(model):
    return [t.detach().numpy().copy()
            for t in list(model.parameters()) + list(model.buffers())]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["gradsync", "ddp"])
    ap.add_argument("rank", type=int)
    ap.add_argument("steps", type=int)
    ap.add_argument("out")
    ap.add_argument("--socket")
    ap.add_argument("--wire", default="fp16")
    ap.add_argument("--init")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--no-buffers", action="store_true")
    ap.add_argument("--local-rank", type=int, help="default: rank (one node)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = make_model(a.rank)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    net = model
    if a.mode == "gradsync":
        import gradsync.torch
        gradsync.torch.GradSync(model, wire=a.wire, optimizer=opt, socket_path=a.socket,
                                local_rank=a.rank if a.local_rank is None else a.local_rank,
                                broadcast_buffers=not a.no_buffers)
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"file://{a.init}", rank=a.rank,
                                world_size=a.world)
        net = torch.nn.parallel.DistributedDataParallel(model)
    out = {f"init{i}": t for i, t in enumerate(state_arrays(model))}
    step = [0]

    def record(module, args):
        for j, b in enumerate(module.buffers()):
            out[f"fwd{step[0]}_{j}"] = b.detach().numpy().copy()
    model.register_forward_pre_hook(record)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step[0] in range(1, a.steps + 1):
        x, y = batch(a.rank, step[0])
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()
    out.update({f"p{i}": p.detach().numpy().copy() for i, p in enumerate(model.parameters())})
    np.savez(a.out, **out)
    if a.mode == "ddp":
        torch.distributed.destroy_process_group()
    print("done", flush=True)


if __name__ == "__main__":
    main()
