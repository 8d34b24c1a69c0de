"""A tour of the dynamic embedding table, numbaemb only (no TensorFlow).

A stream of Zipf-distributed ids (like real users and items, hashed over the whole
int64 range) arrives in batches.  The tour shows, in order:

1. a table that grows as ids appear, trained by sparse Adam steps;
2. lookups of absent ids (initial values, nothing inserted);
3. a bounded table (``max_capacity``, LRU) that evicts as it inserts and hands the
   evicted ids and rows out, and an admission filter that gives an id a row only
   once it has been seen twice;
4. ``steps_to_live``: the ids no step updated lately removed in one pass;
5. a checkpoint saved atomically and loaded into another shard count.

    python examples/demo.py [--batches 20 --batch 200000 --dim 32]

``main`` returns the figures it prints (``tests/examples/test_demo.py`` runs it small).
"""
import argparse
import os
import tempfile
import time

import numpy as np

import numbaemb as ne


def hashed(ids):
    """Small ids spread over the whole int64 range (negative ids included)."""
    return (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)


def zipf_ids(rng, n):
    """``n`` Zipf(1.2) ids, hashed."""
    return hashed(rng.zipf(1.2, n))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--shards", type=int, default=2)
    args = p.parse_args(argv)
    res = {}
    rng = np.random.default_rng(0)
    adam = ne.optimizers.Adam(learning_rate=0.01)

    # 1. a growing table, trained by sparse Adam steps
    v = ne.Variable(dim=args.dim, name="item", num_shards=args.shards, steps_to_live=5,
                    initializer=ne.initializers.RandomNormal(stddev=0.05, seed=7))
    hot = hashed(np.ones(1))                              # Zipf's most frequent id
    res["hot_before"] = float(v.lookup(hot).mean())       # its initial values
    print(f"1. {v}")
    print(f"{'batch':>5} {'ids':>9} {'table size':>11} {'new ids':>8} {'ids/s':>12}"
          f"  (lookup + an Adam step)")
    t0 = time.perf_counter()
    for b in range(args.batches):
        ids = zipf_ids(rng, args.batch)
        t = time.perf_counter()
        before = v.size()
        rows = v.lookup(ids)                              # (batch, dim): the forward pass
        grads = rows - 0.1                                # a toy loss: pull rows to 0.1
        ne.optimizers.apply_gradients(v, adam, ids, grads, step=b + 1)   # inserts new ids
        dt = time.perf_counter() - t
        if b % max(1, args.batches // 5) == 0 or b == args.batches - 1:
            print(f"{b:>5} {ids.size:>9,} {v.size():>11,} {v.size() - before:>8,} "
                  f"{ids.size / dt:>12,.0f}")
    res["size"] = v.size()
    print(f"{args.batches} steps in {time.perf_counter() - t0:.2f}s; shard sizes "
          f"{[v.size(i) for i in range(args.shards)]}; columns "
          f"{sorted(v.shards[0].columns)}")
    res["hot_after"] = float(v.lookup(hot).mean())        # trained towards 0.1
    print(f"the hottest id's mean value: {res['hot_before']:.4f} -> {res['hot_after']:.4f}")

    # 2. absent ids read their initial values and are not inserted
    absent = np.array([np.iinfo(np.int64).min, 12345])
    _, exists = v.lookup(absent, return_exists=True)
    res["absent_exists"] = exists.tolist()
    print(f"\n2. absent ids read initial values: exists {exists.tolist()}, size still "
          f"{v.size():,}")

    # 3. a bounded table: LRU eviction on insert, the evicted rows handed out
    cap = max(100, v.size() // 8)
    lru = ne.Variable(dim=args.dim, max_capacity=cap, evict="lru")
    evicted = 0
    for _ in range(3):
        _, ev_keys, ev_rows = lru.find_or_insert(zipf_ids(rng, args.batch),
                                                 return_evicted=True)
        evicted += ev_keys.size                           # spill ev_rows elsewhere here
    res["bounded_size"], res["bounded_capacity"], res["evicted"] = lru.size(), cap, evicted
    print(f"3. bounded table: {lru.size():,} ids of at most {cap:,}; {evicted:,} evicted "
          f"and handed out with their rows ({ev_rows.shape} in the last call)")
    seen = ne.Variable(dim=args.dim, admit=ne.admission.CounterFilter(min_count=2))
    once = np.arange(1_000, dtype=np.int64)
    seen.find_or_insert(once)
    first = seen.size()
    seen.find_or_insert(once[:10])
    res["admitted"] = (first, seen.size())
    print(f"   admission (seen twice): {first} ids after one sighting, {seen.size()} after "
          f"ten of them came back")

    # 4. steps_to_live: ids no step updated in the last 5 steps go, in one pass
    before = v.size()
    removed = ne.expiry.expire(v)
    res["expired"] = removed
    print(f"\n4. expire: {removed:,} of {before:,} ids not updated in the last 5 steps "
          f"removed -> {v.size():,}")

    # 5. an atomic checkpoint, loaded into another shard count
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "item.nbe")
        t = time.perf_counter()
        v.save(path)
        w = ne.Variable.load(path, num_shards=4)
        same = bool(np.array_equal(w.lookup(hot), v.lookup(hot)) and w.size() == v.size())
        res["reload_same"] = same
        print(f"5. saved {os.path.getsize(path) / 1e6:.1f} MB (values and Adam's slots) and "
              f"loaded into 4 shards in {time.perf_counter() - t:.2f}s; same rows: {same}")
    return res


if __name__ == "__main__":
    main()
