#!/usr/bin/env bash
# The GPU checks in one go, for a lent GPU machine (no TensorFlow there):
# the CUDA tests on the real GPU (8 workers), the bounded table's evicting
# inserts (bench_bounded.py --device cuda) and where their time goes
# (profile_cuda_bounded.py), then bench_cuda.py, the training step's profile
# (profile_cuda_step.py) and bench_hybrid.py.
# Logs go to $OUT (or ./gpu_logs). Each step has its own time limit, and a
# failing step does not stop the next.
#   bash benchmarks/run_gpu.sh          (SPLIT=0 skips the two MPI steps)
OUT=${OUT:-gpu_logs}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
# Open MPI as root (the machine's mpiexec), ranks beyond the cores allowed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
{ nvidia-smi -L; python3 -c "import sys, numpy, numba, numba.cuda as c, cupy; print(sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__, 'cupy', cupy.__version__, c.get_current_device().name)"
  python3 -c "import numba_cuda; print('numba-cuda', numba_cuda.__version__)"; } 2>&1 | tee "$OUT/versions.txt"
step() { local limit=$1 name=$2; shift 2; echo "== $name: $*"; local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"; echo "== $name: rc ${PIPESTATUS[0]}, $((SECONDS - t0)) s"; }
step ${TESTS_S:-200} tests python3 -m pytest -m cuda -q -p no:cacheprovider -n ${WORKERS:-8} tests
# split GPU tables: 2 ranks (on one GPU NCCL refuses them and they move arrays through
# host memory; with a GPU a rank, NCCL), if mpi4py is there
[ "${SPLIT:-1}" = 1 ] && python3 -c "import mpi4py" 2>/dev/null && step ${SPLIT_S:-150} split_tables mpiexec -n 2 python3 -m mpi4py -m pytest -q -p no:cacheprovider tests/distributed/test_cuda_split.py
[ "${SPLIT:-1}" = 1 ] && python3 -c "import mpi4py" 2>/dev/null && step ${SPLIT_BENCH_S:-120} bench_split python3 benchmarks/bench_distributed.py --device cuda --ranks 1,2 --steps 10 --warmup 3
step ${BOUNDED_S:-120} bench_bounded python3 benchmarks/bench_bounded.py --device cuda --repeats 5 --stream 0
step ${BENCH_S:-190} bench_cuda python3 benchmarks/bench_cuda.py --repeats ${REPEATS:-7} --profile --x4
step ${STEP_S:-90} profile_step python3 benchmarks/profile_cuda_step.py --repeats 7
step ${HYBRID_S:-100} bench_hybrid python3 benchmarks/bench_hybrid.py --repeats ${REPEATS:-7}
step ${PROFILE_S:-90} profile_bounded python3 benchmarks/profile_cuda_bounded.py --pass-threads 1 --repeats 8 --ab-round-two
