"""One worker of test_launchers.py, started by torchrun or as srun would
start it: nothing but the environment says which job it is part of and
where it sits in it.

    python -m torch.distributed.run ... launched_trainer.py STEPS OUTDIR
    SLURM_PROCID=... MASTER_ADDR=... python launched_trainer.py STEPS OUTDIR

It trains torch_trainer.py's model on torch_trainer.py's data for global
rank $RANK ($SLURM_PROCID) three times side by side: synchronised by
``GradSync(model, optimizer=opt)`` and nothing else (gradsyncd's socket,
the job and its settings from the environment), by PyTorch's DDP on Gloo
with the fp16 compress hook (the reference; env:// from MASTER_ADDR and
MASTER_PORT), and alone. Saves each model's parameters, the largest
gradient seen and the job GradSync was told to OUTDIR/rank$RANK.npz.
"""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import gradsync.torch
from torch_trainer import LR, MOMENTUM, batch, make_model


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def main():
    steps, outdir = int(sys.argv[1]), sys.argv[2]
    # torchrun's; under srun, Slurm's, as PyTorch's Slurm recipes read them.
    rank = int(os.environ.get("RANK") or os.environ["SLURM_PROCID"])
    world = int(os.environ.get("WORLD_SIZE") or os.environ["SLURM_NTASKS"])
    with open(os.path.join(outdir, f"pid{rank}"), "w") as f:  # for the test to end it
        f.write(str(os.getpid()))
    torch.set_num_threads(1)  # the same float operations in every process
    ours, ddp_model, alone = make_model(), make_model(), make_model()
    ours_opt, ddp_opt, alone_opt = sgd(ours), sgd(ddp_model), sgd(alone)
    sync = gradsync.torch.GradSync(ours, optimizer=ours_opt)
    dist.init_process_group("gloo", rank=rank, world_size=world)  # MASTER_ADDR, MASTER_PORT
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    loss_fn = torch.nn.CrossEntropyLoss()
    gmax = 0.0
    for step in range(1, steps + 1):
        x, y = batch(rank, step)
        for net, opt in ((ours, ours_opt), (ddp, ddp_opt), (alone, alone_opt)):
            opt.zero_grad()
            loss_fn(net(x), y).backward()
            opt.step()
        gmax = max(gmax, max(p.grad.abs().max().item() for p in ours.parameters()))
    i = sync.client.info
    job = np.array([i.global_rank, i.world_size, i.local_size, i.nodes, i.node_rank,
                    i.threshold, sync.client.bucket_count])
    out = {"gmax": np.float64(gmax), "job": job, "wire": np.array(i.wire_dtype)}
    for name, model in (("ours", ours), ("ddp", ddp_model), ("alone", alone)):
        for k, p in enumerate(model.parameters()):
            out[f"{name}{k}"] = p.detach().numpy().copy()
    np.savez(os.path.join(outdir, f"rank{rank}.npz"), **out)
    sync.close()
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
