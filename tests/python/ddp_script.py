"""A plain DDP training script, written for this test: a small CNN with
BatchNorm on synthetic images, a DistributedSampler, SGD with momentum
and weight decay, two epochs, launched by torchrun. With SYNC=gradsync
in the environment the same script runs with gradsync instead, changed
only in the three lines the README documents (marked "the three lines");
everything else, the sampler and rank-0 logging included, is the same.

The replicas start apart, as an unseeded script's do: each rank seeds
its model with its own rank (rank 0's weights are the ones both systems
broadcast at wrap). Saves every parameter and buffer at the end to
OUTDIR/$SYNC-rank$RANK.npz.

    torchrun --nproc-per-node 2 ddp_script.py OUTDIR
"""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

SYNC = os.environ.get("SYNC", "ddp")
SAMPLES, BATCH, EPOCHS = 256, 32, 2


def make_model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))


def dataset():
    g = torch.Generator().manual_seed(7)  # the data is the job's, the same everywhere
    x = torch.randn(SAMPLES, 3, 8, 8, generator=g)
    y = (x[:, 0].mean(dim=(1, 2)) > 0).long() + 2 * (x[:, 1].mean(dim=(1, 2)) > 0).long()
    return torch.utils.data.TensorDataset(x, y)


def main():
    outdir = sys.argv[1]
    torch.set_num_threads(1)  # the same float operations in every process
    torch.manual_seed(int(os.environ["RANK"]))  # replicas that start apart
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    if SYNC == "ddp":
        dist.init_process_group("gloo")
        net = torch.nn.parallel.DistributedDataParallel(model)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        import gradsync.torch                                        # the three lines
        sync = gradsync.torch.GradSync(model, optimizer=opt, wire="fp32")
        net, rank, world = model, sync.rank, sync.world_size
    sampler = torch.utils.data.DistributedSampler(dataset(), num_replicas=world, rank=rank,
                                                  shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH, sampler=sampler)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    np.savez(os.path.join(outdir, f"{SYNC}-rank{rank}.npz"), **state)
    if SYNC == "ddp":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
