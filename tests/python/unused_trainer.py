"""One trainer of the unused-parameter comparison (test_unused.py): a model
with parameters that not every rank uses, trained with GradSync or with
DDP(find_unused_parameters=True). Saves the final parameters, which
gradients were None before each optimizer step, and the frozen layer's
weights when it was frozen, to OUT.npz.

    unused_trainer.py gradsync RANK STEPS OUT --socket S --wire fp16|fp32 [--local-rank L]
    unused_trainer.py ddp      RANK STEPS OUT --init FILE [--fp16-hook]

The model, h = tanh(mid(tanh(trunk(x)))), output head(h), plus:
- aux(h), used by rank 0 on odd steps only: no rank uses it on even steps;
- dead, used by no rank ever;
- mid, frozen (requires_grad = False) before step FREEZE_AT, after the
  wrapping.
SGD with momentum and weight decay moves any parameter that is given a
gradient, even a zero one; one whose .grad is None it leaves alone.
"""
import argparse

import numpy as np
import torch

LR = 0.05
MOMENTUM = 0.9
WEIGHT_DECAY = 0.01
THRESHOLD = 2048  # elements: several buckets, aux and dead in their own
FREEZE_AT = 4
WORLD = 2


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same initial weights in every process
        self.trunk = torch.nn.Linear(32, 64)
        self.mid = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 10)
        self.aux = torch.nn.Linear(64, 10)
        self.dead = torch.nn.Linear(64, 10)

    def forward(self, x, use_aux):
        h = torch.tanh(self.mid(torch.tanh(self.trunk(x))))
        out = self.head(h)
        return out + self.aux(h) if use_aux else out


def batch(rank, step):
    """This rank's synthetic batch for `step`: inputs and class labels."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(64, 32, generator=g)
    y = (x[:, :10].sum(dim=1) * 3).long().remainder(10)
    return x, y


def uses_aux(rank, step):
    return rank == 0 and step % 2 == 1


def wrap(a, model, opt):
    """The synchronised model: GradSync's or DDP's."""
    if a.mode == "gradsync":
        import gradsync.torch
        local_rank = a.rank if a.local_rank is None else a.local_rank
        gradsync.torch.GradSync(model, threshold=THRESHOLD, wire=a.wire, optimizer=opt,
                                socket_path=a.socket, local_rank=local_rank)
        return model
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    dist.init_process_group("gloo", init_method=f"file://{a.init}", rank=a.rank,
                            world_size=WORLD)
    net = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    if a.fp16_hook:
        net.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return net


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["gradsync", "ddp"])
    ap.add_argument("rank", type=int)
    ap.add_argument("steps", type=int)
    ap.add_argument("out")
    ap.add_argument("--socket")
    ap.add_argument("--wire", default="fp16")
    ap.add_argument("--init")
    ap.add_argument("--fp16-hook", action="store_true")
    ap.add_argument("--local-rank", type=int, help="the trainer's rank on its node "
                    "(default: RANK, all trainers on one node)")
    a = ap.parse_args()
    torch.set_num_threads(1)  # the same float operations in every process
    model = Model()
    names = [n for n, _ in model.named_parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM,
                          weight_decay=WEIGHT_DECAY)
    net = wrap(a, model, opt)
    loss_fn = torch.nn.CrossEntropyLoss()
    none = np.zeros((a.steps, len(names)), dtype=np.int8)
    frozen = {}
    gmax = 0.0
    for step in range(1, a.steps + 1):
        if step == FREEZE_AT:
            for n, p in model.mid.named_parameters():
                p.requires_grad_(False)
                frozen[f"frozen.{n}"] = p.detach().numpy().copy()
        x, y = batch(a.rank, step)
        opt.zero_grad()  # set_to_none: DDP's users' default
        loss_fn(net(x, uses_aux(a.rank, step)), y).backward()
        # What reaches the optimizer: GradSync's wait runs in its step
        # pre-hook, so the gradients are read there, before the update.
        grads = {}

        def look(optimizer, args, kwargs):
            for n, p in model.named_parameters():
                grads[n] = p.grad
        h = opt.register_step_pre_hook(look)
        opt.step()
        h.remove()
        for k, n in enumerate(names):
            none[step - 1, k] = grads[n] is None
            if grads[n] is not None:
                gmax = max(gmax, grads[n].abs().max().item())
    out = {f"p.{n}": p.detach().numpy().copy() for n, p in model.named_parameters()}
    np.savez(a.out, none=none, names=np.array(names), gmax=np.float64(gmax), **out, **frozen)
    if a.mode == "ddp":
        torch.distributed.destroy_process_group()
    print("done", flush=True)


if __name__ == "__main__":
    main()
