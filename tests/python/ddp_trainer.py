"""One rank of test_ddp.py: what DDP users do between backward() and
optimizer.step(), done side by side by GradSync and by PyTorch's DDP on
Gloo, in the same process, on the same data, from the same weights.

    ddp_trainer.py RANK WORLD OUT --init FILE --socket S --wire fp16|fp32

Each case below trains a fresh pair of torch_trainer.py's model (one
wrapped by GradSync, its own job on gradsyncd; one by DDP, with the fp16
compress hook when the wire is fp16) and records what the test compares:

- clip: clip_grad_norm_ between backward() and step(), with optimizer=;
  the norm each side saw, and the local gradient's norm (a twin's, before
  any synchronisation) to show the two ranks' local norms differ;
- scaler: a GradScaler (unscale_, clip_grad_norm_, step, update), with an
  infinite loss on rank 0 at step INF_AT: each step's scale and how far
  it moved the weights;
- wait: wait() twice after backward() and optimizer= as well; the step id
  each call returned, and gradsyncd's count of the job's finished steps;
- sampler: an epoch through DistributedSampler fed from GradSync's rank
  and world, against one fed from the process group; GradSync's rank,
  world and place on the node, against torch.distributed's;
- no_sync: ACCUMULATE micro-batches, all but the last under no_sync().

Each case saves its pair's final weights and the gradients each side
held once backward() had returned.
"""
import argparse
import copy

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import gradsync
import gradsync.torch
from torch_trainer import LR, MOMENTUM, THRESHOLD, batch, make_model

STEPS = 6
MAX_NORM = 0.1      # below every step's gradient norm: clipping acts
INF_AT = 3          # the scaler case's step with an infinite loss on rank 0
INIT_SCALE = 2.0 ** 10  # the scaled gradients stay well inside fp16's range
ACCUMULATE = 3
SAMPLES, BATCH = 192, 32


class Pair:
    """The same seeded model twice: ours through GradSync (with
    optimizer=), theirs through DDP; each with its SGD optimizer."""

    def __init__(self, a, case):
        self.case = case
        self.ours, self.theirs = make_model(), make_model()
        self.ours_opt, self.theirs_opt = sgd(self.ours), sgd(self.theirs)
        self.sync = gradsync.torch.GradSync(
            self.ours, threshold=THRESHOLD, wire=a.wire, optimizer=self.ours_opt,
            socket_path=a.socket, local_rank=a.rank, job_id=f"ddp-{a.wire}-{case}")
        self.ddp = torch.nn.parallel.DistributedDataParallel(self.theirs)
        if a.wire == "fp16":
            self.ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        self.grads = {"ours": [], "theirs": []}

    def sides(self):
        """(side, what to call, the model, its optimizer) for each."""
        return (("ours", self.ours, self.ours, self.ours_opt),
                ("theirs", self.ddp, self.theirs, self.theirs_opt))

    def keep_grads(self, side, model):
        self.grads[side].append(flat(p.grad for p in model.parameters()))

    def save(self, out):
        for side, model in (("ours", self.ours), ("theirs", self.theirs)):
            out[f"{self.case}.{side}.weights"] = flat(model.parameters())
            out[f"{self.case}.{side}.grads"] = np.stack(self.grads[side])
        self.sync.close()


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors]).numpy().copy()


def norm(tensors):
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t)
                                                 for t in tensors])).item()


LOSS = torch.nn.CrossEntropyLoss()


def clip(a, out):
    pair = Pair(a, "clip")
    norms, local = [], []
    for step in range(1, STEPS + 1):
        x, y = batch(a.rank, step)
        twin = copy.deepcopy(pair.ours)
        local.append(norm(torch.autograd.grad(LOSS(twin(x), y), list(twin.parameters()))))
        row = []
        for side, net, model, opt in pair.sides():
            opt.zero_grad()
            LOSS(net(x), y).backward()
            pair.keep_grads(side, model)
            row.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
            opt.step()
        norms.append(row)
    out["clip.norms"] = np.array(norms)
    out["clip.local_norms"] = np.array(local)
    pair.save(out)


def scaler(a, out):
    """The AMP recipe's loop (without autocast: the scaler's part is what
    differs); a step the scaler skips leaves the weights where they were."""
    pair = Pair(a, "scaler")
    scalers = {side: torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
               for side, *_ in pair.sides()}
    rows = []
    for step in range(1, STEPS + 1):
        x, y = batch(a.rank, step)
        poison = float("inf") if step == INF_AT and a.rank == 0 else 1.0
        row = []
        for side, net, model, opt in pair.sides():
            s = scalers[side]
            before = flat(model.parameters())
            scale = s.get_scale()
            opt.zero_grad()
            s.scale(LOSS(net(x), y) * poison).backward()
            pair.keep_grads(side, model)
            s.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e6)
            s.step(opt)
            s.update()
            row += [scale, float(np.max(np.abs(flat(model.parameters()) - before)))]
        rows.append(row)
    out["scaler.rows"] = np.array(rows)  # scale, weights moved; ours, then theirs
    pair.save(out)


def wait_twice(a, out):
    pair = Pair(a, "wait")
    ids = []
    for step in range(1, STEPS + 1):
        x, y = batch(a.rank, step)
        for side, net, model, opt in pair.sides():
            opt.zero_grad()
            LOSS(net(x), y).backward()
            pair.keep_grads(side, model)
            if side == "ours":
                ids.append([pair.sync.last_result.step, pair.sync.wait().step,
                            pair.sync.wait().step])
            opt.step()
        ids[-1].append(pair.sync.last_result.step)
    with gradsync.Control(a.socket) as ctl:
        job = [j for j in ctl.jobs() if j.job_id == f"ddp-{a.wire}-wait"]
    out["wait.ids"] = np.array(ids)
    out["wait.steps_completed"] = np.array(job[0].steps_completed if job else -1)
    pair.save(out)


def sampler(a, out):
    pair = Pair(a, "sampler")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(SAMPLES, 32, generator=g)
    ds = TensorDataset(x, (x[:, :10].sum(dim=1) * 3).long().remainder(10))
    s = pair.sync
    samplers = {"ours": DistributedSampler(ds, num_replicas=s.world_size, rank=s.rank,
                                           seed=7),
                "theirs": DistributedSampler(ds, seed=7)}  # from the process group
    indices = {side: [] for side in samplers}
    for epoch in range(2):
        for side, net, model, opt in pair.sides():
            samplers[side].set_epoch(epoch)
            indices[side].append(list(samplers[side]))
            for xb, yb in DataLoader(ds, batch_size=BATCH, sampler=samplers[side]):
                opt.zero_grad()
                LOSS(net(xb), yb).backward()
                opt.step()
            pair.keep_grads(side, model)
    out["sampler.place"] = np.array([s.rank, s.world_size, s.local_rank, s.local_size,
                                     s.node_rank, s.nodes])
    out["sampler.dist"] = np.array([dist.get_rank(), dist.get_world_size()])
    for side in indices:
        out[f"sampler.{side}.indices"] = np.array(indices[side])
    pair.save(out)


def no_sync(a, out):
    pair = Pair(a, "no_sync")
    syncs = {"ours": pair.sync.no_sync, "theirs": pair.ddp.no_sync}
    for step in range(1, STEPS + 1):
        for side, net, model, opt in pair.sides():
            opt.zero_grad()
            for micro in range(ACCUMULATE):
                x, y = batch(a.rank, ACCUMULATE * step + micro)
                if micro < ACCUMULATE - 1:
                    with syncs[side]():
                        LOSS(net(x), y).backward()
                else:
                    LOSS(net(x), y).backward()
            pair.keep_grads(side, model)
            opt.step()
    pair.save(out)


CASES = {"clip": clip, "scaler": scaler, "wait": wait_twice, "sampler": sampler,
         "no_sync": no_sync}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rank", type=int)
    ap.add_argument("world", type=int)
    ap.add_argument("out")
    ap.add_argument("--init", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--wire", choices=["fp16", "fp32"], required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)  # the same float operations in every process
    dist.init_process_group("gloo", init_method=f"file://{a.init}", rank=a.rank,
                            world_size=a.world)
    out = {}
    for name, case in CASES.items():
        case(a, out)
        print(f"rank {a.rank}: {name} done", flush=True)
    np.savez(a.out, **out)
    # Left to the interpreter's exit, the group's Gloo threads are torn
    # down under it (see torch_trainer.py).
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
