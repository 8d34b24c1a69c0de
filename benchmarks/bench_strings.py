"""String-key lookups against int64-key lookups of the same table, in one run.

Prints one Markdown table.  A table of ``--keys`` string keys (``"user:<n>"``
with random 63-bit ``n``, 8 to 24 bytes) and its int64 twin (keys ``n``) hold the
same rows; each row times one operation on a batch of ``--batch`` keys:

* numbaemb, numpy in: ``StringVariable.lookup(object array of bytes)`` against
  ``Variable.lookup(int64 array)``.  The int64 lookup is the limit of a string
  lookup (after its ids are known, a string lookup *is* that lookup), so
  ``int64 / string`` is the share of the limit reached.
* the phases of a string lookup: ``pack`` (Python ``bytes`` objects into one
  buffer: C-level, but per object), FarmHash fingerprints, the name index (probe
  + byte compare), the row lookup by id.
* tf_bridge, tensors in: ``de.Variable(key_dtype=tf.string).lookup`` on a
  ``tf.string`` tensor against the int64 ``de.Variable`` and against TensorFlow's
  own string table, ``tf.lookup.experimental.MutableHashTable(tf.string,
  tf.float32, value_shape=[dim])`` (what TFRA's CPU string table is built like),
  holding the same rows.
* inserts: ``upsert`` of new string keys against new int64 keys.

    python benchmarks/bench_strings.py                 # 1M keys, batches of 200k, dim 32
    python benchmarks/bench_strings.py --quick         # smoke run

Method: one process; cases run in alternation (one untimed warm-up round, then
``--repeats`` rounds, median of ``time.perf_counter``), so every case meets the
same load from other processes and the ratios hold on a busy machine.  Inserts
start from the same state every round (the new keys are removed, untimed).
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def as_obj(items):
    out = np.empty(len(items), object)
    out[:] = items
    return out


def make_keys(rng, n):
    nums = np.unique(rng.integers(0, 2 ** 63 - 1, int(n * 1.01) + 16, dtype=np.int64))
    nums = rng.permutation(nums)[:n]
    strs = as_obj([b"user:%d" % x for x in nums.tolist()])
    return nums, strs


def interleaved(cases, repeats):
    """``{name: median seconds}``: every case once per round, one warm-up round."""
    times = {name: [] for name in cases}
    for r in range(repeats + 1):
        for name, (fn, before) in cases.items():
            if before is not None:
                before()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if r:
                times[name].append(dt)
            time.sleep(0.01)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000, help="keys in the table")
    ap.add_argument("--batch", type=int, default=200_000, help="keys per operation")
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-tf", action="store_true", help="skip the TensorFlow rows")
    ap.add_argument("--quick", action="store_true", help="smoke run: 100k keys, batch 20k")
    args = ap.parse_args()
    if args.quick:
        args.keys, args.batch, args.repeats = 100_000, 20_000, 2

    import numba
    import numbaemb as ne
    from jit_kernels.strings import level0_ids, pack

    rng = np.random.default_rng(0)
    nums, strs = make_keys(rng, args.keys + args.batch)
    new_nums, new_strs = nums[args.keys:], strs[args.keys:]
    nums, strs = nums[:args.keys], strs[:args.keys]
    rows = rng.standard_normal((args.keys, args.dim)).astype(np.float32)
    s_var = ne.Variable(args.dim, key_dtype="string")
    i_var = ne.Variable(args.dim)
    for lo in range(0, args.keys, args.batch):
        s_var.upsert(strs[lo:lo + args.batch], rows[lo:lo + args.batch])
        i_var.upsert(nums[lo:lo + args.batch], rows[lo:lo + args.batch])
    pick = rng.integers(0, args.keys, args.batch)
    q_nums, q_strs = nums[pick], strs[pick]
    assert np.array_equal(s_var.lookup(q_strs), i_var.lookup(q_nums))
    q_buf, q_starts = pack(q_strs)
    q_fp = level0_ids(q_buf, q_starts)
    q_ids = s_var.ids(q_strs)
    names = s_var.names

    cases = {
        "lookup (hit), string": (lambda: s_var.lookup(q_strs), None),
        "lookup (hit), int64": (lambda: i_var.lookup(q_nums), None),
        "lookup (miss), string": (lambda: s_var.lookup(new_strs), None),
        "lookup (miss), int64": (lambda: i_var.lookup(new_nums), None),
        "phase: pack": (lambda: pack(q_strs), None),
        "phase: fingerprints": (lambda: level0_ids(q_buf, q_starts), None),
        "phase: name index": (lambda: names._find(q_buf, q_starts, np.arange(q_fp.shape[0]),
                                                  q_fp), None),
        "phase: rows by id": (lambda: s_var.lookup(q_ids), None),
        "upsert (new keys), string": (lambda: s_var.upsert(new_strs, rows[:len(new_strs)]),
                                      lambda: s_var.remove(new_strs)),
        "upsert (new keys), int64": (lambda: i_var.upsert(new_nums, rows[:len(new_nums)]),
                                     lambda: i_var.remove(new_nums)),
    }
    tf_version = None
    if not args.no_tf:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as tf
        import tf_bridge as de
        tf_version = tf.__version__
        ds = de.Variable(key_dtype=tf.string, dim=args.dim, name="bench_s")
        di = de.Variable(dim=args.dim, name="bench_i")
        ds.table, di.table = s_var, i_var          # the same tables, behind the TF API
        mht = tf.lookup.experimental.MutableHashTable(tf.string, tf.float32,
                                                      np.zeros(args.dim, np.float32))
        mht.insert(tf.constant(strs), tf.constant(rows))
        t_strs, t_nums = tf.constant(q_strs), tf.constant(q_nums)
        assert np.array_equal(mht.lookup(t_strs).numpy(), ds.lookup(t_strs).numpy())
        cases.update({
            "tf: lookup (hit), de string": (lambda: ds.lookup(t_strs), None),
            "tf: lookup (hit), de int64": (lambda: di.lookup(t_nums), None),
            "tf: lookup (hit), MutableHashTable string": (lambda: mht.lookup(t_strs), None),
        })
    t = interleaved(cases, args.repeats)
    rate = {k: args.batch / v / 1e6 for k, v in t.items()}

    print(f"keys in table {args.keys:,}; batch {args.batch:,}; dim {args.dim}; repeats "
          f"{args.repeats} (median); numba threads {numba.get_num_threads()}; cpus "
          f"{os.cpu_count()}; tensorflow {tf_version or '-'}; load average "
          f"{os.getloadavg()[0]:.1f}")
    print("| operation | string keys | int64 keys (limit) | string / int64 | "
          "TF MutableHashTable (string) | string / TF |")
    print("|---|---|---|---|---|---|")

    def row(name, s, i, tfk=None):
        ratio = f"{rate[s] / rate[i]:.2f}x" if i else ""
        tf_cell = f"{rate[tfk]:.2f} M/s" if tfk in rate else ""
        tf_ratio = f"{rate[s] / rate[tfk]:.2f}x" if tfk in rate else ""
        print(f"| {name} | {rate[s]:.2f} M/s | {f'{rate[i]:.2f} M/s' if i else ''} | {ratio} | "
              f"{tf_cell} | {tf_ratio} |")

    row("numbaemb lookup (hit), numpy in", "lookup (hit), string", "lookup (hit), int64")
    row("numbaemb lookup (miss), numpy in", "lookup (miss), string", "lookup (miss), int64")
    row("upsert (new keys)", "upsert (new keys), string", "upsert (new keys), int64")
    if tf_version:
        row("tf_bridge lookup (hit), tensor in", "tf: lookup (hit), de string",
            "tf: lookup (hit), de int64", "tf: lookup (hit), MutableHashTable string")
    total = t["lookup (hit), string"]
    for name in ("phase: pack", "phase: fingerprints", "phase: name index",
                 "phase: rows by id"):
        print(f"| {name} (string lookup's time: {100 * t[name] / total:.0f}%) | "
              f"{rate[name]:.2f} M/s |  |  |  |  |")
    print(f"| memory of the name index | {names.nbytes / args.keys:.0f} B/key "
          f"(arena + index) |  |  |  |  |")


if __name__ == "__main__":
    main()
