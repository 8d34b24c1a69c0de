"""Throughput and memory of a numbaemb table against DenseHashTable and a gather limit.

Prints one Markdown table.  Per dim and operation: numbaemb keys/s, the same work
on ``tf.lookup.experimental.DenseHashTable`` (int64 keys, value shape ``[dim]``),
the limit (a parallel gather of the same rows by known row number, no hashing, with
the table kernels' prefetching and streaming stores: :func:`make_limit`), the ratios, and the issue's targets.  Then bytes per live key
by RSS for a fresh table built in a subprocess, and first-call compile time
(empty ``NUMBA_CACHE_DIR``) against the warm-cache import + first call.

    python benchmarks/bench_table.py                       # the issue's sizes
    python benchmarks/bench_table.py --quick               # smoke run, seconds
    python benchmarks/bench_table.py --profile             # + where the time goes

Method: random int64 keys (``np.random.default_rng``); a table of ``--keys`` keys
built by ``find_or_insert`` in batches of ``--batch`` (as training would build
it; DenseHashTable by lookup + insert); batches of ``--batch`` keys in random
order; misses and new keys are keys not in the table.  One process per dim holds
both tables; each operation is timed against its DenseHashTable twin (and
lookup (hit) against the limit) in alternation, one untimed warm-up round
(compile excluded) then ``--repeats`` rounds, ``time.perf_counter``, median.
Alternating makes both sides meet the same load from other processes, so the
ratios hold on a busy machine even when the absolute numbers move.  Mutations
start from the same state every time: numbaemb's shard is restored from a
snapshot (untimed), DenseHashTable is put back by the inverse operation
(untimed).  Outputs are allocated inside the timed call for all three (a lookup
returns a new array; the limit allocates its output the same way).
DenseHashTable results stay tensors (no ``.numpy()``), which favours it; its
export is filtered to live buckets (it exports every bucket), as ours returns
live keys only.  The default initializer (zeros) is used unless a row says
RandomNormal (mean 0, stddev 0.05).  The ``out=`` row writes into a buffer made
(and its pages mapped) once, as a loop that reuses its output buffer does.
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

I64 = np.iinfo(np.int64)
DHT_EMPTY, DHT_DELETED = int(I64.min), int(I64.min) + 1   # never drawn as benchmark keys
TARGET_DIM = 64
_clock = time.perf_counter


# ---------------------------------------------------------------------------------
# keys and timing
# ---------------------------------------------------------------------------------
def random_keys(rng, n, exclude=None):
    """``n`` distinct random int64 keys, none equal to DHT's sentinels or in ``exclude``."""
    out = np.empty(0, np.int64)
    while out.shape[0] < n:
        k = rng.integers(DHT_DELETED + 1, I64.max, size=int((n - out.shape[0]) * 1.01) + 16,
                         dtype=np.int64, endpoint=True)
        out = np.unique(np.concatenate([out, k]))
        if exclude is not None:
            out = out[~np.isin(out, exclude)]
    return rng.permutation(out)[:n]


def settle():
    """A pause between timed calls, so that worker threads of the previous call
    (TensorFlow's spin before they sleep) are idle again."""
    time.sleep(0.02)


def once(fn, before=None, after=None):
    """Seconds of one ``fn()``; ``before`` / ``after`` run untimed."""
    if before is not None:
        before()
    t0 = _clock()
    fn()
    t = _clock() - t0
    if after is not None:
        after()
    settle()
    return t


def interleaved(cases, repeats):
    """Median seconds of each case ``name -> (fn, before, after)``.

    Cases run in turn, round after round (one untimed warm-up round first), so
    that every case meets the same mix of load from other processes: the
    ratios between cases are what this benchmark reports.
    """
    times = {name: [] for name in cases}
    for r in range(repeats + 1):
        for name, (fn, before, after) in cases.items():
            t = once(fn, before, after)
            if r:
                times[name].append(t)
    return {name: statistics.median(v) for name, v in times.items()}


# ---------------------------------------------------------------------------------
# numbaemb side
# ---------------------------------------------------------------------------------
def snapshot(var):
    """Copy of every shard's state (used to restart mutations from the same table)."""
    return [dict(slots=s.slots.copy(), free=s.free_rows.copy(), n_full=s.n_full,
                 n_deleted=s.n_deleted, fresh=s.fresh,
                 cols={n: c.data.copy() for n, c in s.columns.items()}) for s in var.shards]


def restore(var, snap):
    """Put ``var``'s shards back to a snapshot (columns in the shard's own kind of storage)."""
    try:
        from numbaemb.shard import arena_empty
    except ImportError:                      # older layout: plain numpy columns
        arena_empty = lambda r, w, dt: np.empty((r, w), dt)  # noqa: E731
    for s, st in zip(var.shards, snap):
        s.slots = st["slots"].copy()
        s.free_rows = st["free"].copy()
        s.n_full, s.n_deleted, s.fresh = st["n_full"], st["n_deleted"], st["fresh"]
        for n, c in s.columns.items():
            src = st["cols"][n]
            c.data = None
            c.data = arena_empty(src.shape[0], src.shape[1], src.dtype)
            c.data[:] = src


def build_numbaemb(dim, keys, batch, initializer=None):
    import numbaemb as ne
    var = ne.Variable(dim=dim, initializer=initializer)
    for i in range(0, keys.shape[0], batch):
        var.find_or_insert(keys[i:i + batch])
    return var


def make_limit():
    """The gather limit: the same rows by known row number, no hashing, with the table
    kernels' own row copy (rows requested ahead; outputs of 1 MB and more written with
    streaming stores, ``jit_kernels.streams``), so no store the lookup uses is missing
    from it (before session 43 a plain gather, which the streaming lookup could beat)."""
    from jit_kernels.cpu_table import gather_rows
    from jit_kernels.streams import STREAM_MIN
    from numbaemb._memory import aligned_empty

    def limit(values, rows):
        out = aligned_empty((rows.shape[0], values.shape[1]), values.dtype)
        gather_rows(values, rows, out, STREAM_MIN)
        return out

    return limit


def numbaemb_cases(dim, table_keys, hit, miss, vals, args):
    """A numbaemb table of ``table_keys`` and its timed cases ``op -> (fn, before, after)``,
    plus ``profile()`` (where the time goes) and facts about the table."""
    import numba

    import numbaemb as ne
    var = build_numbaemb(dim, table_keys, args.batch)
    snap = snapshot(var)
    reset = lambda: restore(var, snap)  # noqa: E731
    shard = var.shards[0]
    rows = shard.find_rows(hit)
    assert (rows >= 0).all()
    limit = make_limit()
    np.testing.assert_array_equal(limit(shard.values, rows), var.lookup(hit))
    rn = ne.Variable(dim=dim, initializer=ne.initializers.RandomNormal())
    buf = np.ones((miss.size, dim), var.value_dtype)
    reset_rn = lambda: restore(rn, snap)  # noqa: E731
    cases = {
        "lookup (hit)": (lambda: var.lookup(hit), None, None),
        "limit": (lambda: limit(shard.values, rows), None, None),
        "lookup (miss)": (lambda: var.lookup(miss), None, None),
        "find_or_insert (new keys)": (lambda: var.find_or_insert(miss), reset, reset),
        # the same into a buffer the caller reuses (its pages mapped once, before the run)
        "find_or_insert (new keys), out=": (lambda: var.find_or_insert(miss, out=buf), reset,
                                           reset),
        "upsert (existing)": (lambda: var.upsert(hit, vals), reset, None),
        "remove": (lambda: var.remove(hit), reset, reset),
        "export": (var.export, None, None),
        # the same table state, another initializer for new rows
        "lookup (miss), RandomNormal": (lambda: rn.lookup(miss), reset_rn, None),
        "find_or_insert (new keys), RandomNormal": (lambda: rn.find_or_insert(miss), reset_rn,
                                                    None),
    }

    def profile():
        from jit_kernels.cpu_table import gather
        from numbaemb._memory import aligned_empty

        def copy_found():
            gather(shard.values, rows, aligned_empty((rows.shape[0], dim), shard.values.dtype))

        reset()
        got = interleaved({
            "lookup": cases["lookup (hit)"],
            "probe (find_rows)": (lambda: shard.find_rows(hit), None, None),
            "copy rows (gather into a new array)": (copy_found, None, None),
            "limit": cases["limit"]}, args.repeats)
        return {"profile_lookup": {k: v * 1e3 for k, v in got.items()},
                "profile": profile_find_or_insert(var, miss, snap, args.repeats),
                "profile_rn": profile_find_or_insert(rn, miss, snap, args.repeats)}

    facts = {"export_n": var.size(), "threads": numba.get_num_threads()}
    return cases, profile, facts


def profile_find_or_insert(var, keys, snap, repeats):
    """Per-phase medians of ``Variable.find_or_insert`` (one shard), in ms."""
    from jit_kernels.cpu_table import gather
    from numbaemb._memory import aligned_empty
    shard = var.shards[0]
    phases = {}
    for i in range(repeats + 1):
        restore(var, snap)
        flat = np.ascontiguousarray(keys.reshape(-1), np.int64)
        t = [_clock()]
        shard._reserve(flat)
        t.append(_clock())
        rows, inserted = shard._insert_reserved(flat)
        t.append(_clock())
        shard._init_new(rows, flat, inserted)
        t.append(_clock())
        out = aligned_empty((flat.shape[0], var.dim), var.value_dtype)
        t.append(_clock())
        gather(shard.values, rows, out)
        t.append(_clock())
        if i:
            for name, a, b in zip(("reserve", "probe/insert", "init", "alloc out", "gather"),
                                  t, t[1:]):
                phases.setdefault(name, []).append((b - a) * 1e3)
    return {k: statistics.median(v) for k, v in phases.items()}


# ---------------------------------------------------------------------------------
# DenseHashTable side
# ---------------------------------------------------------------------------------
def import_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf
    except ImportError:
        return None
    return tf


def dht_cases(tf, dim, table_keys, hit, miss, vals, batch):
    """DenseHashTable of the same keys (built the same way) and its timed cases."""
    tbl = tf.lookup.experimental.DenseHashTable(
        key_dtype=tf.int64, value_dtype=tf.float32, default_value=tf.zeros([dim], tf.float32),
        empty_key=DHT_EMPTY, deleted_key=DHT_DELETED)
    for i in range(0, table_keys.shape[0], batch):
        k = tf.constant(table_keys[i:i + batch])
        tbl.insert(k, tbl.lookup(k))
    hit_t, miss_t, vals_t = tf.constant(hit), tf.constant(miss), tf.constant(vals)

    def find_or_insert():       # lookup (default value for absent keys) + insert
        tbl.insert(miss_t, tbl.lookup(miss_t))

    def export():   # DHT exports every bucket; keep the live ones, as our export returns
        keys, values = tbl.export()
        keys = tf.reshape(keys, [-1])
        live = tf.logical_and(keys != DHT_EMPTY, keys != DHT_DELETED)
        return tf.boolean_mask(keys, live), tf.boolean_mask(values, live)

    n = int(tbl.size())
    assert int(export()[0].shape[0]) == n
    return {
        "lookup (hit)": (lambda: tbl.lookup(hit_t), None, None),
        "lookup (miss)": (lambda: tbl.lookup(miss_t), None, None),
        "find_or_insert (new keys)": (find_or_insert, None, lambda: tbl.remove(miss_t)),
        "upsert (existing)": (lambda: tbl.insert(hit_t, vals_t), None, None),
        "remove": (lambda: tbl.remove(hit_t), None, lambda: tbl.insert(hit_t, vals_t)),
        "export": (export, None, None),
    }, None, {"export_n": n}


# ---------------------------------------------------------------------------------
# subprocess measurements: memory and compile time
# ---------------------------------------------------------------------------------
def child_memory(kind, n_keys, dim, batch):
    """Runs in a fresh process: RSS delta of a table of ``n_keys`` keys."""
    import psutil
    proc = psutil.Process()
    rng = np.random.default_rng(1)
    if kind == "numbaemb":
        import numbaemb as ne
        var = ne.Variable(dim=dim)
        var.find_or_insert(np.arange(10))            # compile / load kernels first
        var.clear()
        gc.collect()
        rss0 = proc.memory_info().rss
        for i in range(0, n_keys, batch):
            keys = rng.integers(DHT_DELETED + 1, I64.max, size=min(batch, n_keys - i), dtype=np.int64)
            var.find_or_insert(keys)
            del keys
        size = var.size()
    else:
        tf = import_tf()
        tbl = tf.lookup.experimental.DenseHashTable(
            key_dtype=tf.int64, value_dtype=tf.float32, default_value=tf.zeros([dim], tf.float32),
            empty_key=DHT_EMPTY, deleted_key=DHT_DELETED)
        k = tf.constant(np.arange(10, dtype=np.int64))
        tbl.insert(k, tbl.lookup(k))
        tbl.remove(k)
        gc.collect()
        rss0 = proc.memory_info().rss
        for i in range(0, n_keys, batch):
            k = tf.constant(rng.integers(DHT_DELETED + 1, I64.max, size=min(batch, n_keys - i),
                                         dtype=np.int64))
            tbl.insert(k, tbl.lookup(k))
            del k
        size = int(tbl.size())
    gc.collect()
    rss1 = proc.memory_info().rss
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(dict(size=size, rss_delta=rss1 - rss0, peak_delta=peak - rss0)))


def child_compile():
    """Runs in a fresh process: import time and first calls of every operation."""
    t0 = time.perf_counter()
    import numbaemb as ne
    t1 = time.perf_counter()
    var = ne.Variable(dim=8)
    keys = np.arange(100, dtype=np.int64)
    var.find_or_insert(keys)
    var.lookup(keys)
    var.upsert(keys, np.ones((100, 8), np.float32))
    var.export()
    var.remove(keys)
    t2 = time.perf_counter()
    print(json.dumps(dict(imp=t1 - t0, first=t2 - t1)))


def make_data(args, dim):
    """The benchmark's keys and values; the same in every process."""
    rng = np.random.default_rng(0)
    table_keys = random_keys(rng, args.keys)
    hit = rng.choice(table_keys, size=args.batch, replace=False)
    miss = random_keys(rng, args.batch, exclude=table_keys)
    vals = np.random.default_rng(dim).standard_normal((args.batch, dim), dtype=np.float32)
    return table_keys, hit, miss, vals


def child_worker(kind, dim, args):
    """Runs in its own process: builds one library's table, then times one case
    per request read from stdin (``time <op>``, ``profile``, ``quit``)."""
    data = make_data(args, dim)
    if kind == "numbaemb":
        cases, profile, facts = numbaemb_cases(dim, *data, args)
    else:
        cases, profile, facts = dht_cases(import_tf(), dim, *data, args.batch)
    reply(dict(facts, ops=sorted(cases)))
    for line in sys.stdin:
        cmd, _, op = line.strip().partition(" ")
        if cmd == "time":
            fn, before, after = cases[op]
            reply(once(fn, before, after))
        elif cmd == "profile":
            reply(profile() if profile else {})
        else:
            return


def reply(obj):
    sys.stdout.write("@@" + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Worker:
    """A ``child_worker`` process driven from here."""

    def __init__(self, kind, dim, argv):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--_child", "worker", "--_kind", kind,
             "--dims", str(dim)] + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.facts = self._read()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("@@"):
                return json.loads(line[2:])
        raise RuntimeError(f"benchmark worker exited with {self.proc.wait()}")

    def ask(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait()


def bench_dim(dim, argv, with_tf, repeats, profile):
    """Seconds per operation for numbaemb, the limit and DenseHashTable.

    Each library runs in its own process (neither one's threads or allocator
    disturb the other); both are alive at once and this process has them time
    each operation in alternation, one untimed warm-up round then ``repeats``
    rounds, so that both meet the same load from other processes."""
    workers = {"ours": Worker("numbaemb", dim, argv)}
    if with_tf:
        workers["dht"] = Worker("dht", dim, argv)
    times = {}
    groups = [["lookup (hit)", "limit"], ["lookup (miss)"],
              ["find_or_insert (new keys)", "find_or_insert (new keys), out="],
              ["upsert (existing)"], ["remove"], ["export"], ["lookup (miss), RandomNormal"],
              ["find_or_insert (new keys), RandomNormal"]]
    for group in groups:
        for r in range(repeats + 1):
            for op in group:
                for who, w in workers.items():
                    if op in w.facts["ops"]:
                        t = w.ask(f"time {op}")
                        settle()
                        if r:
                            times.setdefault((who, op), []).append(t)
    res = dict(workers["ours"].facts)
    dht = dict(workers["dht"].facts) if with_tf else {}
    for (who, op), ts in times.items():
        (res if who == "ours" else dht)[op] = statistics.median(ts)
    if profile:
        res.update(workers["ours"].ask("profile"))
    for w in workers.values():
        w.close()
    return res, dht


def child_tfversion():
    tf = import_tf()
    print(json.dumps(dict(version=None if tf is None else tf.__version__)))


def run_child(argv, env=None):
    out = subprocess.run([sys.executable, os.path.abspath(__file__)] + argv, env=env,
                         stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compile_times():
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        cold = run_child(["--_child", "compile"], env)
        warm = run_child(["--_child", "compile"], env)
    return cold, warm


# ---------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------
OPS = ["lookup (hit)", "lookup (miss)", "find_or_insert (new keys)",
       "find_or_insert (new keys), out=", "upsert (existing)",
       "remove", "export", "lookup (miss), RandomNormal", "find_or_insert (new keys), RandomNormal"]


def mks(n, t):
    return f"{n / t / 1e6:.2f} M/s"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", default="8,64", help="comma-separated row widths")
    ap.add_argument("--keys", type=int, default=4_000_000, help="keys in the table")
    ap.add_argument("--batch", type=int, default=1_000_000, help="keys per operation")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs (median reported)")
    ap.add_argument("--memory-keys", type=int, default=10_000_000,
                    help="keys of the dim-64 table whose RSS is measured (0: skip)")
    ap.add_argument("--no-tf", action="store_true", help="skip DenseHashTable")
    ap.add_argument("--no-compile", action="store_true", help="skip the compile-time runs")
    ap.add_argument("--profile", action="store_true", help="also print find_or_insert phases")
    ap.add_argument("--keep-cache", action="store_true",
                    help="use Numba's usual cache (default: a fresh one for this run)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 200k keys, batches of 50k, 2 repeats, 500k memory keys")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    ap.add_argument("--_kind", default="numbaemb", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._child == "compile":
        return child_compile()
    if args._child == "tfversion":
        return child_tfversion()
    if args._child == "memory":
        return child_memory(args._kind, args.memory_keys, TARGET_DIM, args.batch)
    if args._child == "worker":
        return child_worker(args._kind, int(args.dims), args)
    if args.quick:
        args.keys, args.batch, args.repeats = 200_000, 50_000, 2
        args.memory_keys = min(args.memory_keys, 500_000)
    dims = [int(d) for d in args.dims.split(",")]
    tf_version = None
    if not args.no_tf:
        try:
            tf_version = run_child(["--_child", "tfversion"])["version"]
        except subprocess.CalledProcessError:
            tf_version = None
    common = ["--keys", str(args.keys), "--batch", str(args.batch),
              "--repeats", str(args.repeats)] + (["--profile"] if args.profile else [])
    # Numba's cache does not follow imports: a kernel cached before a per-element body
    # changed keeps the old body.  Compile into a fresh cache (shared by this run's
    # children) so that the numbers are those of the source as it is.
    cache = None
    if "NUMBA_CACHE_DIR" not in os.environ and not args.keep_cache:
        cache = tempfile.TemporaryDirectory(prefix="bench_table_numba_")
        os.environ["NUMBA_CACHE_DIR"] = cache.name

    load0 = os.getloadavg()[0]
    rows, profiles = [], {}
    for dim in dims:
        ours, dht = bench_dim(dim, common, tf_version is not None, args.repeats, args.profile)
        for k in ("profile", "profile_rn", "profile_lookup"):
            if k in ours:
                profiles[(dim, k)] = ours.pop(k)
        for op in OPS:
            n = ours["export_n"] if op == "export" else args.batch
            t = ours[op]
            row = [str(dim), op, mks(n, t)]
            ratio_dht = ratio_lim = None
            if op in dht:
                nd = dht["export_n"] if op == "export" else args.batch
                row.append(mks(nd, dht[op]))
                ratio_dht = (n / t) / (nd / dht[op])
            else:
                row.append("—" if tf_version is None or "RandomNormal" in op or "out=" in op
                           else "n/a")
            if op == "lookup (hit)":
                row.append(mks(args.batch, ours["limit"]))
                ratio_lim = ours["limit"] / t
            else:
                row.append("")
            row.append(f"{ratio_dht:.2f}x" if ratio_dht is not None else "")
            row.append(f"{ratio_lim:.2f}x" if ratio_lim is not None else "")
            target, ok = "", None
            if dim == TARGET_DIM and op == "lookup (hit)":
                target = ">= 2.5x DHT, >= 0.7x limit"
                ok = (ratio_dht is None or ratio_dht >= 2.5) and ratio_lim >= 0.7
                if ratio_dht is None:
                    target += " (DHT not run)"
            elif dim == TARGET_DIM and op == "find_or_insert (new keys)":
                target, ok = ">= 10 M/s", n / t >= 10e6
            row += [target, "" if ok is None else ("PASS" if ok else "MISS")]
            rows.append(row)

    if args.memory_keys:
        raw = 8 + 4 * TARGET_DIM
        m = run_child(["--_child", "memory", "--_kind", "numbaemb", "--memory-keys",
                       str(args.memory_keys), "--batch", str(args.batch)])
        per = m["rss_delta"] / m["size"]
        row = [str(TARGET_DIM), f"memory, {m['size'] / 1e6:g}M keys: bytes/live key (RSS); peak",
               f"{per:.0f} B ({per / raw:.2f}x raw {raw} B); peak {m['peak_delta'] / m['size'] / raw:.2f}x"]
        if tf_version is not None:
            d = run_child(["--_child", "memory", "--_kind", "dht", "--memory-keys",
                           str(args.memory_keys), "--batch", str(args.batch)])
            pd = d["rss_delta"] / d["size"]
            row.append(f"{pd:.0f} B ({pd / raw:.2f}x raw); peak {d['peak_delta'] / d['size'] / raw:.2f}x")
        else:
            row.append("—")
        row += ["", "", "", "<= 1.5x raw", "PASS" if per <= 1.5 * raw else "MISS"]
        rows.append(row)

    if not args.no_compile:
        cold, warm = compile_times()
        rows.append(["—", "first use, empty NUMBA_CACHE_DIR: import; first calls",
                     f"{cold['imp']:.2f} s; {cold['first']:.1f} s", "", "", "", "", "", ""])
        rows.append(["—", "first use, warm cache: import; first calls",
                     f"{warm['imp']:.2f} s; {warm['first']:.2f} s", "", "", "", "", "", ""])

    head = ["dim", "operation", "numbaemb", "DenseHashTable", "gather limit", "ours/DHT",
            "ours/limit", "target", "result"]
    print(f"keys in table {args.keys:,}; batch {args.batch:,}; repeats {args.repeats} (median); "
          f"numba threads {ours['threads']}; cpus {os.cpu_count()}; "
          f"tensorflow {tf_version or 'not run'}; load average at start {load0:.1f}, "
          f"at end {os.getloadavg()[0]:.1f} (other processes share these cores)")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    order = {"profile_lookup": 0, "profile": 1, "profile_rn": 2}
    for (dim, k), ph in sorted(profiles.items(), key=lambda x: (x[0][0], order[x[0][1]])):
        if k == "profile_lookup":
            print(f"\nlookup (hit) pieces, dim {dim} (median ms, measured in alternation): "
                  + ", ".join(f"{p} {v:.1f}" for p, v in ph.items()))
            continue
        name = "RandomNormal" if k == "profile_rn" else "default (zeros)"
        print(f"\nfind_or_insert phases, dim {dim}, {name} initializer (median ms): "
              + ", ".join(f"{p} {v:.1f}" for p, v in ph.items())
              + f"; sum {sum(ph.values()):.1f}")


if __name__ == "__main__":
    main()
