"""Three things DDP users do without thinking, with GradSync: a model under
torch.compile, autocast, and a checkpoint saved and resumed.

One trainer in this process, a world of one on the fp16 wire, so the
reduced gradient is the local gradient rounded through fp16, which torch
computes on its own: a gradient the daemon did not reduce (a hook that
never fired under the compiler) is fp32 and fails the comparison.

- torch.compile: the compiled model's gradients are marked and reduced
  each step (AOTAutograd's backward with the "aot_eager" backend, which
  runs the graph torch's default "inductor" backend would generate code
  for; inductor's C++ build takes half a minute on a CI core).
- Autocast (bfloat16 on the CPU, as AMP's float16 on a GPU): the forward
  runs in half precision, the fp32 parameters get fp32 gradients, which
  are reduced as any others. A bfloat16 product is exact in fp16, so here
  the daemon also clips each element (clip_value), which an unreduced
  gradient would not show.
- GradSync.clip_grad_norm_ after GradScaler.unscale_ (AMP's recipe):
  the daemon's norm is of the scaled gradients, so the clip must see that
  they changed and give torch's result on the unscaled ones; and a second
  clip sees the first one's change.
- Checkpoints: model and optimizer state_dicts saved mid-run from a
  wrapped model have the model's own keys (GradSync does not wrap the
  model as DDP does, so no "module." prefix). A fresh model that loads
  them, before it is wrapped or after, then trains on bit for bit as the
  uninterrupted run.
"""
import copy
import io

from pylib import Daemon, check, run, set_job

THRESHOLD = 64  # elements: several buckets for the small model below
STEPS = 4


def make_model(seed):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 4))


def batch(step):
    import torch
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(24, 16, generator=g)


def loss_of(model, step):
    return model(batch(step)).square().sum()


def test_compiled_model_gradients_are_reduced():
    import torch
    import gradsync.torch as gst
    torch.set_num_threads(1)
    set_job(1, threshold=THRESHOLD)
    d = Daemon([])
    try:
        model = make_model(0)
        sync = gst.GradSync(model, threshold=THRESHOLD, socket_path=d.socket)
        compiled = torch.compile(model, backend="aot_eager")
        for step in range(1, STEPS + 1):
            twin = copy.deepcopy(model)
            want = torch.autograd.grad(loss_of(twin, step), list(twin.parameters()))
            sync.zero_grad()
            loss_of(compiled, step).backward()
            r = sync.wait()
            check(not r.aborted, f"step {step} aborted")
            for i, (p, w) in enumerate(zip(model.parameters(), want)):
                # aot_eager's decomposed backward may round differently
                # from eager autograd by an ulp of fp32, which can move
                # the fp16 rounding by one fp16 ulp (2^-10 relative).
                check(torch.allclose(p.grad, w.half().float(), rtol=2 ** -10, atol=0),
                      f"step {step} parameter {i}: not the fp16-reduced local gradient")
                rounded = p.grad.half().float()
                check(torch.equal(p.grad, rounded),
                      f"step {step} parameter {i}: the gradient was not reduced on the fp16 "
                      "wire (the hook did not fire under torch.compile)")
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
        sync.close()
    finally:
        d.cleanup()


def test_autocast_gradients_are_reduced():
    import torch
    import gradsync.torch as gst
    torch.set_num_threads(1)
    set_job(1, threshold=THRESHOLD)
    d = Daemon([])
    try:
        model = make_model(0)
        clip = 0.5
        sync = gst.GradSync(model, threshold=THRESHOLD, clip_value=clip, socket_path=d.socket)
        for step in range(1, 3):
            twin = copy.deepcopy(model)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                twin_loss = loss_of(twin, step)
            want = torch.autograd.grad(twin_loss.float(), list(twin.parameters()))
            sync.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(model, step)
            check(loss.dtype == torch.bfloat16, f"autocast did not run: loss is {loss.dtype}")
            loss.float().backward()
            r = sync.wait()
            check(not r.aborted, f"step {step} aborted")
            want_clipped = sum(int((w.abs() > clip).sum()) for w in want)
            check(r.clipped == want_clipped > 0,
                  f"step {step}: {r.clipped} elements clipped, {want_clipped} above {clip}")
            for i, (p, w) in enumerate(zip(model.parameters(), want)):
                check(p.grad.dtype == torch.float32, f"parameter {i}: gradient {p.grad.dtype}")
                check(torch.equal(p.grad, w.clamp(-clip, clip).half().float()),
                      f"step {step} parameter {i}: not the clipped, fp16-reduced local gradient")
        sync.close()
    finally:
        d.cleanup()


def test_clip_after_unscale_is_torchs():
    import torch
    import gradsync.torch as gst
    torch.set_num_threads(1)
    set_job(1, threshold=THRESHOLD)
    d = Daemon([])
    try:
        model = make_model(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        sync = gst.GradSync(model, threshold=THRESHOLD, optimizer=opt, socket_path=d.socket)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        max_norm = 0.25
        # The first call is torch's (GradSync starts marking the reduced
        # gradients); the next, on unchanged gradients, takes the daemon's
        # norm as it is.
        for step in (1, 2):
            sync.zero_grad()
            loss_of(model, step).backward()
            got = sync.clip_grad_norm_(max_norm)
            opt.step()
        check(float(got) == float(torch.tensor(sync.last_result.grad_norm, dtype=torch.float32)),
              f"step 2: the clip's norm {float(got)} is not the daemon's "
              f"{sync.last_result.grad_norm}")
        sync.zero_grad()
        scaler.scale(loss_of(model, 3)).backward()
        scaled_norm = sync.last_result.grad_norm
        scaler.unscale_(opt)
        # Torch's clip on copies of the unscaled gradients: the reference.
        twin = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
        for t, p in zip(twin, model.parameters()):
            t.grad = p.grad.clone()
        want_norm = torch.nn.utils.clip_grad_norm_(twin, max_norm)
        check(float(want_norm) > 2 * max_norm, f"nothing to clip: norm {float(want_norm)}")
        check(scaled_norm > 100 * float(want_norm),
              f"the reduced norm {scaled_norm} is not the scaled gradients'")
        got = sync.clip_grad_norm_(max_norm)
        check(torch.allclose(got, want_norm, rtol=1e-6, atol=0),
              f"clip after unscale_: norm {float(got)}, torch's {float(want_norm)}")
        for i, (p, t) in enumerate(zip(model.parameters(), twin)):
            check(torch.allclose(p.grad, t.grad, rtol=1e-6, atol=0),
                  f"parameter {i}: not torch's clipped gradient")
        again = sync.clip_grad_norm_(max_norm)
        check(abs(float(again) - max_norm) < 1e-5 * max_norm,
              f"a second clip saw the norm before the first: {again}")
        scaler.step(opt)
        scaler.update()
        sync.close()
    finally:
        d.cleanup()


def train_steps(model, opt, sync, first, last):
    for step in range(first, last + 1):
        opt.zero_grad()
        loss_of(model, step).backward()
        sync.wait()
        opt.step()


def test_checkpoint_resumes_bit_for_bit():
    import torch
    import gradsync.torch as gst
    torch.set_num_threads(1)
    set_job(1, threshold=THRESHOLD)
    d = Daemon([])
    try:
        def optimizer(model):
            return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                                   weight_decay=1e-3)

        model = make_model(0)
        opt = optimizer(model)
        sync = gst.GradSync(model, threshold=THRESHOLD, socket_path=d.socket)
        train_steps(model, opt, sync, 1, 2)
        saved = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, saved)
        train_steps(model, opt, sync, 3, STEPS)
        want = [p.detach().clone() for p in model.parameters()]
        sync.close()
        check(list(model.state_dict()) == list(make_model(0).state_dict()),
              f"state_dict keys are not the model's own: {list(model.state_dict())}")

        for order in ("load, then wrap", "wrap, then load"):
            saved.seek(0)
            ckpt = torch.load(saved)
            fresh = make_model(1)  # other weights, so that loading must matter
            fresh_opt = optimizer(fresh)
            if order == "load, then wrap":
                fresh.load_state_dict(ckpt["model"])
                fresh_opt.load_state_dict(ckpt["opt"])
                sync = gst.GradSync(fresh, threshold=THRESHOLD, socket_path=d.socket)
            else:
                sync = gst.GradSync(fresh, threshold=THRESHOLD, socket_path=d.socket)
                fresh.load_state_dict(ckpt["model"])
                fresh_opt.load_state_dict(ckpt["opt"])
            train_steps(fresh, fresh_opt, sync, 3, STEPS)
            sync.close()
            for i, (p, w) in enumerate(zip(fresh.parameters(), want)):
                check(torch.equal(p, w), f"{order}: parameter {i} differs from the "
                      f"uninterrupted run by {(p - w).abs().max().item():.3g}")
            print(f"{order}: resumed bit for bit", flush=True)
    finally:
        d.cleanup()


if __name__ == "__main__":
    run([test_compiled_model_gradients_are_reduced, test_autocast_gradients_are_reduced,
         test_clip_after_unscale_is_torchs,
         test_checkpoint_resumes_bit_for_bit])
