"""A trainer of test_cuda_state.py: registers a state in (emulated) CUDA
memory with Client.register_state_cuda, beside no gradients, and
broadcasts it from global rank 1. argv: SOCKET RANK.

Its device memory comes from the CUDA emulation's runtime
(GS_CUDA_EMU_LIB, the libcuda.so.1 that libgradsync then finds already
loaded), through ctypes: one allocation on the emulated GPU of its local
rank, holding tensors of four dtypes (one of 5 MiB) at 512-byte offsets,
the bytes between them a guard of this rank. After the broadcast each
tensor must hold rank 1's hash, computed here, and the guard must be
untouched. Prints PASS and exits 0, or says what differed."""
import ctypes
import os
import sys

import numpy as np

import gradsync

TENSORS = [("fc.weight", (5 << 20) + 4, "float32"), ("fc.bias", 2 * 1001, "float16"),
           ("bn.num_batches_tracked", 8, "int64"), ("mask", 777, "uint8")]
H2D, D2H = 1, 2  # cudaMemcpyKind


def pattern(rank, k, n):
    """emu-state-trainer.c's hash of (rank, tensor, byte), in NumPy."""
    x = (np.uint64(rank) << np.uint64(56)) ^ (np.uint64(k) << np.uint64(40)) \
        ^ np.arange(n, dtype=np.uint64)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0x7fb5d329728ea185)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x81dadef4bc2dd44d)
    return (x >> np.uint64(33)).astype(np.uint8)


def layout():
    offsets, off = [], 0
    for _, nbytes, _ in TENSORS:
        offsets.append(off)
        off = (off + nbytes + 511) // 512 * 512 + 512  # a gap of guard bytes
    return offsets, off


def expected(owner, rank, offsets, total):
    host = np.full(total, 0xa5 ^ rank, dtype=np.uint8)
    for k, ((_, nbytes, _), off) in enumerate(zip(TENSORS, offsets)):
        host[off:off + nbytes] = pattern(owner, k, nbytes)
    return host


def main():
    sock, rank = sys.argv[1], int(sys.argv[2])
    cu = ctypes.CDLL(os.environ["GS_CUDA_EMU_LIB"], mode=ctypes.RTLD_GLOBAL)

    def cuda(e, what):
        if e != 0:
            sys.exit(f"cuda_state_trainer: {what}: CUDA error {e}")

    offsets, total = layout()
    cuda(cu.cudaSetDevice(rank), "cudaSetDevice")
    base = ctypes.c_void_p()
    cuda(cu.cudaMalloc(ctypes.byref(base), ctypes.c_size_t(total)), "cudaMalloc")
    mine = expected(rank, rank, offsets, total)
    cuda(cu.cudaMemcpy(base, mine.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(total), H2D),
         "cudaMemcpy")
    c = gradsync.Client(sock, rank)
    c.register_state_cuda([(name, nbytes, dtype, base.value + off)
                           for (name, nbytes, dtype), off in zip(TENSORS, offsets)])
    try:
        c.state(0)
        sys.exit("cuda_state_trainer: state() gave a view of CUDA state")
    except gradsync.StateError:
        pass
    res = c.broadcast_state(1)
    back = np.empty(total, dtype=np.uint8)
    cuda(cu.cudaMemcpy(back.ctypes.data_as(ctypes.c_void_p), base, ctypes.c_size_t(total), D2H),
         "cudaMemcpy")
    want = expected(1, rank, offsets, total)
    bad = np.flatnonzero(back != want)
    if bad.size:
        sys.exit(f"cuda_state_trainer: rank {rank}: {bad.size} bytes differ, the first at "
                 f"{bad[0]}: {back[bad[0]]:#x}, want {want[bad[0]]:#x}")
    if res.nbytes != sum(t[1] for t in TENSORS):
        sys.exit(f"cuda_state_trainer: the result says {res.nbytes} bytes")
    print(f"PASS rank {rank}: {len(TENSORS)} CUDA state tensors hold rank 1's bytes")
    c.close()


if __name__ == "__main__":
    main()
