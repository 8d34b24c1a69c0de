"""Whether NCCL, through CuPy, runs two ranks on one GPU (needs a GPU and CuPy's NCCL).

The split-table exchange for GPU tables (tables across processes, requirement 7)
would run over NCCL; the machines lent here have one GPU.  This starts two
processes that open one NCCL communicator on device 0 (the unique id handed over by
the parent) and all-reduce four floats, and prints what each rank got or raised.

    NCCL_DEBUG=WARN python3 benchmarks/probe_nccl.py
"""
import multiprocessing as mp
import queue


def rank_main(rank, uid, out):
    try:
        import cupy as cp
        from cupy.cuda import nccl
        cp.cuda.Device(0).use()
        comm = nccl.NcclCommunicator(2, uid, rank)
        x = cp.full(4, rank + 1, cp.float32)
        comm.allReduce(x.data.ptr, x.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                       cp.cuda.Stream.null.ptr)
        cp.cuda.Stream.null.synchronize()
        out.put((rank, "ok", x.get().tolist()))
    except Exception as e:       # report it: the parent prints every rank's outcome
        out.put((rank, "raised", repr(e)))


def main():
    from cupy.cuda import nccl
    print("NCCL", nccl.get_version())
    uid = nccl.get_unique_id()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, uid, out)) for r in range(2)]
    for p in procs:
        p.start()
    for _ in procs:
        try:
            print(out.get(timeout=60))
        except queue.Empty:
            print("no answer within 60 s (hung)")
            break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()


if __name__ == "__main__":
    main()
