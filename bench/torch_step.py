"""Times a training step of python/examples/train.py's model in N trainer
processes, synchronised by gradsync (gradsyncd, host backend, fp16 wire),
by DDP on Gloo (fp32, and with PyTorch's fp16 compress hook), and not at
all (the floor: compute alone), in one invocation. The systems take turns
R times (every other turn in reverse order); each figure is the median
of its R runs, each run's own figure being the median step (the slowest
trainer's) after a warm-up step.

--model transformer times a 27M-parameter transformer instead of the
example's MLP. --before DIR adds "gradsync-before": the same gradsync run
with the gradsync package of DIR (another checkout's python/), taking
turns with this one, to see what a change to the package costs.
--systems picks which systems run.

Prints one line per system and the ratio of each baseline to gradsync;
writes the runs to OUT/torch-step.csv.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "python", "examples", "train.py")
SYSTEMS = ["gradsync", "ddp", "ddp-fp16", "none"]


def job_env(procs):
    """The job, as its trainers carry it (libgradsync reads it from their
    environment): procs trainers on this node."""
    return {"GRADSYNC_LOCAL_SIZE": str(procs)}


def start_daemon(path, sock, procs, log):
    p = subprocess.Popen([path, f"--socket={sock}", "--node-port=0"],
                         stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"gradsyncd did not start (see {log.name})")
        time.sleep(0.05)
    return p


def run(system, args, sock):
    env = {**os.environ, **job_env(args.procs)}
    if system == "gradsync-before":
        env["PYTHONPATH"] = args.before
    argv = [sys.executable, EXAMPLE, "--sync", system.removesuffix("-before"),
            "--model", args.model, "--procs", str(args.procs),
            "--steps", str(args.steps), "--json", "--socket", sock]
    # train.py's trainer processes inherit its environment, and the job.
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    if r.returncode:
        raise SystemExit(f"{system} failed:\n{r.stdout}{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", required=True, help="the gradsyncd to run")
    ap.add_argument("--out", required=True, help="folder for torch-step.csv")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", choices=["mlp", "transformer"], default="mlp")
    ap.add_argument("--before", metavar="DIR",
                    help="also time gradsync with the gradsync package in DIR")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help="which to run, comma-separated (gradsync always runs)")
    args = ap.parse_args()
    systems = ["gradsync"] + [s for s in args.systems.split(",") if s in SYSTEMS[1:]]
    if args.before:
        systems.insert(1, "gradsync-before")
    os.makedirs(args.out, exist_ok=True)
    runs = {s: [] for s in systems}
    with tempfile.TemporaryDirectory(prefix="gs-torch-bench-") as tmp:
        sock = os.path.join(tmp, "gs.sock")
        with open(os.path.join(tmp, "gradsyncd.log"), "w") as log:
            daemon = start_daemon(args.daemon, sock, args.procs, log)
            try:
                for rep in range(args.repeat):
                    # Every other turn in reverse, so that a load that
                    # rises or falls during the run favours no system.
                    for s in systems if rep % 2 == 0 else reversed(systems):
                        runs[s].append(run(s, args, sock))
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(30)
    with open(os.path.join(args.out, "torch-step.csv"), "w") as f:
        f.write("system,run,procs,steps,params,step_ms_median,loss_first,loss_last\n")
        for s in systems:
            for i, r in enumerate(runs[s]):
                f.write(f"{s},{i},{r['procs']},{r['steps']},{r['params']},"
                        f"{r['step_ms_median']:.3f},{r['loss_first']:.5f},"
                        f"{r['loss_last']:.5f}\n")
    med = {s: statistics.median(r["step_ms_median"] for r in runs[s]) for s in systems}
    p = runs["gradsync"][0]["params"]
    print(f"training step of the {args.model}, {args.procs} trainers, {p} parameters "
          f"({p * 4 / 1e6:.1f} MB of fp32 gradients), median of {args.repeat} runs:")
    names = {"gradsync": "gradsync (fp16 wire)", "gradsync-before": "gradsync, the --before package",
             "ddp": "DDP on Gloo, fp32",
             "ddp-fp16": "DDP on Gloo, fp16 compress hook", "none": "no synchronisation"}
    for s in systems:
        each = ", ".join(f"{r['step_ms_median']:.2f}" for r in runs[s])
        ratio = "" if s in ("gradsync", "none") else \
            f"   {med[s] / med['gradsync']:.2f}x gradsync's time"
        print(f"  {names[s]:34s} {med[s]:8.2f} ms  [{each}]{ratio}")
    if "none" in med:
        over = ", ".join(f"{names[s]} {med[s] - med['none']:.2f} ms" for s in systems
                         if s != "none")
        print(f"  sync overhead over no synchronisation: {over}")


if __name__ == "__main__":
    main()
