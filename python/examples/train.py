#!/usr/bin/env python3
"""Data-parallel training of a small model on synthetic data, in several
processes on this machine, with gradsync (or, to compare, PyTorch's DDP on
Gloo, or no synchronisation at all).

    gradsyncd --socket /tmp/gs.sock &
    python3 python/examples/train.py --socket /tmp/gs.sock --procs 2

Each process is one trainer (one per GPU on a GPU node; here, on the CPU).
What gradsync changes in an ordinary training loop is marked "gradsync".
The last line gives the loss and the median time of a training step;
--json prints it as JSON (bench/torch-step.sh reads that).
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.multiprocessing as mp

FEATURES, HIDDEN, CLASSES, BATCH = 256, 1024, 10, 128
# The transformer: 27,311,104 parameters, a batch of SEQS sequences of
# SEQ_LEN tokens.
VOCAB, WIDTH, HEADS, FFN, LAYERS, SEQS, SEQ_LEN = 8192, 512, 8, 2048, 6, 4, 64


class Transformer(torch.nn.Module):
    """Embedding, LAYERS encoder layers and a head over the vocabulary."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        layer = torch.nn.TransformerEncoderLayer(WIDTH, HEADS, FFN, dropout=0.0,
                                                 batch_first=True)
        self.layers = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, x):
        return self.head(self.layers(self.embed(x))).reshape(-1, VOCAB)


def make_model(kind="mlp"):
    torch.manual_seed(0)  # the same initial weights in every trainer
    if kind == "transformer":
        return Transformer()
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES))


def batches(rank, steps, kind="mlp"):
    """Rank's share of a synthetic task: labels from a fixed random teacher
    (linear for the MLP, a map of tokens for the transformer), so there is
    something to learn."""
    g = torch.Generator().manual_seed(100 + rank)
    if kind == "transformer":
        teacher = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))
        for _ in range(steps):
            x = torch.randint(VOCAB, (SEQS, SEQ_LEN), generator=g)
            yield x, teacher[x].reshape(-1)
        return
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        x = torch.randn(BATCH, FEATURES, generator=g)
        yield x, (x @ teacher).argmax(dim=1)


def trainer(rank, args, results):
    torch.set_num_threads(args.threads)
    model = make_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    net = model
    if args.sync == "gradsync":
        import gradsync.torch                                            # gradsync
        sync = gradsync.torch.GradSync(model, optimizer=optimizer,       # gradsync
                                       socket_path=args.socket, local_rank=rank,
                                       local_size=args.procs)
    elif args.sync in ("ddp", "ddp-fp16"):
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        dist.init_process_group("gloo", init_method="file://" + args.init,
                                rank=rank, world_size=args.procs)
        net = torch.nn.parallel.DistributedDataParallel(model)
        if args.sync == "ddp-fp16":
            net.register_comm_hook(None, default_hooks.fp16_compress_hook)
    loss_fn = torch.nn.CrossEntropyLoss()
    times, losses = [], []
    for x, y in batches(rank, args.steps, args.model):
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()            # with gradsync: returns once the gradients are averaged
        optimizer.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if args.sync == "gradsync":
        sync.close()
    results.put((rank, losses[0], losses[-1], times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sync", choices=["gradsync", "ddp", "ddp-fp16", "none"],
                    default="gradsync", help="what synchronises the gradients")
    ap.add_argument("--socket", default=None,
                    help="gradsyncd's socket (default: $GRADSYNC_SOCKET, else "
                         "/run/gradsync/gradsyncd.sock)")
    ap.add_argument("--model", choices=["mlp", "transformer"], default="mlp",
                    help="a 1.3M-parameter MLP, or a 27M-parameter transformer")
    ap.add_argument("--procs", type=int, default=2, help="trainer processes")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per trainer")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        args.init = os.path.join(tmp, "ddp-init")
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=trainer, args=(r, args, results))
                 for r in range(args.procs)]
        for p in procs:
            p.start()
        done = [results.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
            if p.exitcode:
                raise SystemExit(f"a trainer exited with {p.exitcode}")
    done.sort()
    # A step ends when the slowest trainer's does; skip the first (warm-up).
    step_times = [max(d[3][i] for d in done) for i in range(1, args.steps)]
    out = {"sync": args.sync, "procs": args.procs, "steps": args.steps,
           "model": args.model,
           "params": sum(p.numel() for p in make_model(args.model).parameters()),
           "loss_first": done[0][1], "loss_last": done[0][2],
           "step_ms_median": 1000 * statistics.median(step_times)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{args.sync}: {args.procs} trainers, {out['params']} parameters, loss "
              f"{out['loss_first']:.3f} -> {out['loss_last']:.3f}, median step "
              f"{out['step_ms_median']:.2f} ms")


if __name__ == "__main__":
    main()
