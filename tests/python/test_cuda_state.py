"""Client.register_state_cuda against gradsyncd's cuda backend, both on the
CUDA emulation of tests/cuda-emu (GS_DAEMON is gradsyncd-cuda-emu): two
trainer processes (cuda_state_trainer.py), each on its own emulated GPU,
register state of four dtypes (one of 5 MiB) and broadcast it from global
rank 1; each checks every byte against its own hash. GradSync does not use
it yet: that needs PyTorch's CUDA, which CI has not."""
import os
import sys

from pylib import HERE, Daemon, check, run, set_job, spawn

TRAINER = os.path.join(HERE, "cuda_state_trainer.py")


def test_broadcast_across_gpus():
    set_job(2)
    d = Daemon(["--backend=cuda"])
    try:
        procs = []
        for r in range(2):
            log = os.path.join(d.dir, f"trainer{r}.log")
            procs.append((spawn([sys.executable, TRAINER, d.socket, str(r)], log), log))
        for p, log in procs:
            rc = p.wait(120)
            text = open(log, errors="replace").read()
            check(rc == 0 and "PASS" in text, f"trainer exited {rc}:\n{text}")
    finally:
        d.cleanup()


run([test_broadcast_across_gpus])
