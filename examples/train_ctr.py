"""Train a click-through-rate model on dynamic embedding tables, end to end.

The README's first command.  It

1. makes a synthetic click log: ``--features`` sparse features whose ids follow a
   Zipf law (a few very frequent ids, a long tail of rare ones), hashed over the
   whole int64 range, negative ids included, so the vocabulary cannot be sized up
   front.  A planted "true" model decides the clicks: every id has a hidden weight
   and a hidden vector, and click probability = sigmoid(bias + the ids' weights +
   the dot products of every pair of the row's vectors);
2. splits the rows into train and test (the test rows hold ids never seen in
   training, as tomorrow's traffic would) and trains one ``de.keras.layers.Embedding``
   per feature plus a small MLP with ``model.fit`` and
   ``de.DynamicEmbeddingOptimizer(Adam)``; the tables grow as ids arrive;
3. scores the test rows: AUC against a constant prediction (0.5) and against the
   planted model itself (the best AUC any model can reach on these rows);
4. saves a ``tf.train.Checkpoint`` (tables with their Adam slots, dense weights,
   optimizer) and restores it into a freshly built model: identical predictions;
5. exports a SavedModel for serving with ``de.export_for_serving`` and scores a
   batch in a fresh Python process that imports only TensorFlow (numbaemb,
   jit_kernels and tf_bridge are blocked there); its scores must equal
   ``model.predict`` on the same batch.

    python examples/train_ctr.py                      # about a minute on 2 cores
    mpiexec -n 2 python -m mpi4py examples/train_ctr.py --distributed   # tables split over 2 ranks
    python examples/train_ctr.py --rows 8000000 --features 6 --dim 16 \\
        --vocab 500000 --out-dir /tmp/ctr              # bigger; keeps the files

With ``--distributed`` (under ``mpiexec -n N``) every table is split across the
ranks (each id's row on rank ``id mod N``), each rank trains on its share of
every global batch (``--batch-size`` is the global batch) with
``hvd.DistributedOptimizer`` (dense gradients averaged, table gradients sent to
their owners), the checkpoint is ``hvd.Checkpoint`` (a table part per rank) and
rank 0 writes the SavedModel; rank 0 prints.

``main(argv)`` returns the numbers it prints (tests/examples runs it tiny).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

# ---- synthetic data ---------------------------------------------------------------------
_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), \
    np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x):
    """A bijective 64-bit mix (uint64 in, uint64 out): ids spread over all of int64."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def feature_ids(feature, ranks, seed):
    """The int64 id of ``ranks`` (0 = most frequent) of ``feature``: distinct per feature."""
    base = np.uint64(((seed & 0xFFFF) << 48) | (feature << 40))
    return splitmix64(base + ranks.astype(np.uint64)).view(np.int64)


def make_data(rows, features, vocab, seed=0, zipf=1.2, true_dim=4, chunk=500_000):
    """``(ids (rows, features) int64, clicks (rows,) float32, true click probability)``.

    Each feature's ranks follow a Zipf law truncated to ``vocab`` values; each
    (feature, rank) has a hidden weight and a hidden ``true_dim`` vector.  The
    linear part and the pairwise part of the logit have a standard deviation of
    about 1 each.
    """
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, vocab + 1, dtype=np.float64) ** -zipf)
    cdf /= cdf[-1]
    pairs = max(features * (features - 1) // 2, 1)
    weight = rng.normal(0.0, 1.0 / np.sqrt(features), (features, vocab))
    vector = rng.normal(0.0, (pairs * true_dim) ** -0.25, (features, vocab, true_dim))
    ids = np.empty((rows, features), np.int64)
    prob = np.empty(rows, np.float32)
    f_idx = np.arange(features)
    for start in range(0, rows, chunk):                  # bounded memory for big --rows
        stop = min(start + chunk, rows)
        ranks = np.minimum(np.searchsorted(cdf, rng.random((stop - start, features))), vocab - 1)
        for f in range(features):
            ids[start:stop, f] = feature_ids(f, ranks[:, f], seed)
        vecs = vector[f_idx, ranks]                                  # (n, features, true_dim)
        pair_sum = 0.5 * ((vecs.sum(1) ** 2).sum(1) - (vecs ** 2).sum((1, 2)))   # f < g
        logit = -1.2 + weight[f_idx, ranks].sum(1) + pair_sum
        prob[start:stop] = 1.0 / (1.0 + np.exp(-logit))
    clicks = (rng.random(rows) < prob).astype(np.float32)
    return ids, clicks, prob


# ---- the model --------------------------------------------------------------------------
def feature_names(features):
    return [f"feature_{f}" for f in range(features)]


def build_model(features, dim, learning_rate, distributed=False):
    """One dynamic table per feature, their pairwise dot products, and a small MLP
    (``distributed``: tables split across the MPI ranks, gradients reduced)."""
    import keras

    import tf_bridge as de
    from tf_bridge import distributed as hvd

    inputs, embs = [], []
    for name in feature_names(features):
        ids = keras.Input(shape=(), dtype="int64", name=name)        # one id per row
        inputs.append(ids)
        embs.append(de.keras.layers.Embedding(dim, name=f"{name}_emb",        # (batch, dim)
                                              distributed=distributed)(ids))
    dots = [keras.layers.Dot(axes=1)([embs[i], embs[j]])
            for i in range(features) for j in range(i + 1, features)]
    x = keras.layers.Concatenate()(embs + dots) if len(embs + dots) > 1 else embs[0]
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    click = keras.layers.Dense(1, activation="sigmoid", name="click")(x)
    model = keras.Model(inputs, click, name="ctr")
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(learning_rate))
    model.compile(optimizer=hvd.DistributedOptimizer(opt) if distributed else opt,
                  loss="binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return model


def as_inputs(ids):
    return {name: ids[:, f] for f, name in enumerate(feature_names(ids.shape[1]))}


def auc(labels, scores):
    import keras
    m = keras.metrics.AUC(num_thresholds=2000)
    m.update_state(labels, np.asarray(scores, np.float32).reshape(-1))
    return float(m.result())


def log_loss(labels, p):
    p = np.clip(np.asarray(p, np.float64).reshape(-1), 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


# ---- serving in a fresh process -----------------------------------------------------------
SERVE = """
import sys
for blocked in ("numbaemb", "jit_kernels", "tf_bridge"):   # serving needs TensorFlow only
    sys.modules[blocked] = None
import json
import numpy as np
import tensorflow as tf

saved = tf.saved_model.load(sys.argv[1])
batch = dict(np.load(sys.argv[2]))
serve = saved.signatures["serving_default"]
out = serve(**{name: tf.constant(ids) for name, ids in batch.items()})
np.save(sys.argv[3], next(iter(out.values())).numpy())
print(json.dumps({"signature inputs": sorted(serve.structured_input_signature[1]),
                  "outputs": sorted(out), "tensorflow": tf.__version__}))
"""


def serve_in_fresh_process(export_dir, batch, work_dir):
    """Scores of ``batch`` ({name: ids}) from the SavedModel, in a new interpreter."""
    script = os.path.join(work_dir, "serve.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(SERVE))
    np.savez(os.path.join(work_dir, "batch.npz"), **batch)
    out = os.path.join(work_dir, "scores.npy")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")   # nothing of this repo
    proc = subprocess.run([sys.executable, script, export_dir,
                           os.path.join(work_dir, "batch.npz"), out],
                          capture_output=True, text=True, cwd=work_dir, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"serving process failed:\n{proc.stderr[-3000:]}")
    return np.load(out), json.loads(proc.stdout.strip().splitlines()[-1])


# ---- main ---------------------------------------------------------------------------------
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4_000_000, help="click log rows (train + test)")
    p.add_argument("--features", type=int, default=4, help="sparse features (one table each)")
    p.add_argument("--dim", type=int, default=8, help="embedding width")
    p.add_argument("--epochs", type=int, default=1,
                   help="passes over the train rows (CTR models tend to overfit from the "
                        "second pass on: the 'one-epoch phenomenon')")
    p.add_argument("--vocab", type=int, default=100_000,
                   help="distinct ids each feature can draw (Zipf over them)")
    p.add_argument("--zipf", type=float, default=1.2,
                   help="Zipf exponent of the id frequencies (larger: more head-heavy)")
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=None,
                   help="where the checkpoint and the SavedModel go (default: a temporary "
                        "directory, removed at the end)")
    p.add_argument("--verbose", type=int, default=1, help="model.fit verbosity (1: progress bar)")
    p.add_argument("--distributed", action="store_true",
                   help="split the tables across the ranks of mpiexec (tf_bridge.distributed)")
    args = p.parse_args(argv)
    for name in ("features", "dim", "epochs", "vocab", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.rows < 10:
        p.error("--rows must be >= 10")
    if not 0 < args.test_fraction < 1:
        p.error("--test-fraction must be in (0, 1)")
    return args


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import tf_bridge as de

    from tf_bridge import distributed as hvd

    keras.utils.set_random_seed(args.seed)
    rank = 0
    if args.distributed:
        hvd.init()
        rank = hvd.rank()
        if rank != 0:                    # rank 0 prints
            sys.stdout = open(os.devnull, "w")
            args.verbose = 0
    out_dir = args.out_dir or (tempfile.mkdtemp(prefix="train_ctr_") if rank == 0 else None)
    if args.distributed:                 # one directory for every rank (same machine or shared)
        out_dir = hvd.broadcast_object(out_dir, 0)
    os.makedirs(out_dir, exist_ok=True)
    try:
        results = _run(args, out_dir, keras, tf, de)
    finally:
        if args.distributed:
            hvd.broadcast_object(None, 0)          # every rank done with the files
        if args.out_dir is None and rank == 0:
            shutil.rmtree(out_dir, ignore_errors=True)
    results["timings"]["total"] = time.perf_counter() - t_start
    print("\nTimings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in results["timings"].items()))
    if args.out_dir is None:
        print("(files removed; pass --out-dir DIR to keep the checkpoint and the SavedModel)")
    else:
        print(f"Files kept in {out_dir}")
    return results


def _run(args, out_dir, keras, tf, de):
    timings, results = {}, {}

    # 1. data --------------------------------------------------------------------------
    t = time.perf_counter()
    ids, clicks, prob = make_data(args.rows, args.features, args.vocab, seed=args.seed,
                                  zipf=args.zipf)
    n_test = max(1, int(round(args.rows * args.test_fraction)))
    n_train = args.rows - n_test
    x_train, y_train = ids[:n_train], clicks[:n_train]
    x_test, y_test = ids[n_train:], clicks[n_train:]
    timings["data"] = time.perf_counter() - t
    seen = [np.unique(x_train[:, f]) for f in range(args.features)]
    unseen = np.stack([~np.isin(x_test[:, f], seen[f]) for f in range(args.features)], axis=1)
    print(f"Synthetic click log: {args.rows:,} rows ({n_train:,} train, {n_test:,} test), "
          f"{args.features} features, Zipf ids over {args.vocab:,} values each, "
          f"hashed into int64 ({(ids < 0).mean():.0%} negative), CTR {clicks.mean():.3f}")
    print(f"  distinct ids in train per feature: {[len(s) for s in seen]}")
    print(f"  test rows with an id never seen in training: {unseen.any(1).mean():.1%} "
          f"(test ids unseen: {unseen.mean():.1%})")
    print(f"  sample ids: {ids[0].tolist()}")

    # 2. train -------------------------------------------------------------------------
    from tf_bridge import distributed as hvd
    dist = args.distributed
    rank, world = (hvd.rank(), hvd.size()) if dist else (0, 1)
    model = build_model(args.features, args.dim, args.learning_rate, dist)
    tables = [model.get_layer(f"{n}_emb").params for n in feature_names(args.features)]
    print(f"\nModel: {args.features} x de.keras.layers.Embedding({args.dim}) + pairwise dots "
          f"+ MLP(64, 32, 1); {model.count_params():,} dense parameters; tables start empty: "
          f"{[int(v.size()) for v in tables]}")
    t = time.perf_counter()
    x_fit, y_fit, batch = x_train, y_train, args.batch_size
    callbacks = []
    if dist:       # the same number of rows (so of steps) on every rank: its share of each batch
        share = n_train // world
        x_fit, y_fit = x_train[rank * share:(rank + 1) * share], y_train[rank * share:(rank + 1) * share]
        batch = max(1, args.batch_size // world)
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd.callbacks.MetricAverageCallback()]
        print(f"{world} ranks: tables split by id mod {world}; {share:,} training rows and a "
              f"batch of {batch} per rank")
    model.fit(as_inputs(x_fit), y_fit, batch_size=batch, epochs=args.epochs,
              shuffle=True, verbose=args.verbose, callbacks=callbacks)
    timings["train"] = time.perf_counter() - t
    sizes = [int(v.size()) for v in tables]
    print(f"table sizes after training: {sizes} (= distinct train ids: "
          f"{sizes == [len(s) for s in seen]})")

    # 3. evaluate ----------------------------------------------------------------------
    t = time.perf_counter()
    pred = model.predict(as_inputs(x_test), batch_size=4096, verbose=0).reshape(-1)
    timings["evaluate"] = time.perf_counter() - t
    assert [int(v.size()) for v in tables] == sizes, "predict must not insert ids"
    ctr = float(y_train.mean())
    results.update(
        auc_model=auc(y_test, pred), auc_baseline=auc(y_test, np.full(n_test, ctr)),
        auc_oracle=auc(y_test, prob[n_train:]), logloss_model=log_loss(y_test, pred),
        logloss_baseline=log_loss(y_test, np.full(n_test, ctr)),
        logloss_oracle=log_loss(y_test, prob[n_train:]))
    old = unseen.any(1)
    if old.all() or not old.any():
        results["auc_model_seen_rows"] = results["auc_model"]
    else:
        results["auc_model_seen_rows"] = auc(y_test[~old], pred[~old])
    print(f"\nTest set ({n_test:,} rows)                        AUC    log loss")
    print(f"  constant prediction (train CTR {ctr:.3f})     {results['auc_baseline']:.4f}   "
          f"{results['logloss_baseline']:.4f}")
    print(f"  dynamic-embedding model                    {results['auc_model']:.4f}   "
          f"{results['logloss_model']:.4f}")
    print(f"    (rows whose ids were all seen in training: AUC "
          f"{results['auc_model_seen_rows']:.4f})")
    print(f"  planted true model (upper bound)           {results['auc_oracle']:.4f}   "
          f"{results['logloss_oracle']:.4f}")
    gap = results["auc_oracle"] - results["auc_baseline"]
    if gap > 0:
        print(f"  the model closes {(results['auc_model'] - results['auc_baseline']) / gap:.0%} "
              f"of the AUC gap between the constant and the true model")

    # 4. checkpoint -> restore into a fresh model ------------------------------------------
    t = time.perf_counter()
    batch = x_test[:16].copy()
    batch[-1] = feature_ids(np.arange(args.features), np.full(args.features, args.vocab + 7),
                            args.seed)                # ids nobody has ever seen
    live = model.predict(as_inputs(batch), verbose=0).reshape(-1)
    Checkpoint = hvd.Checkpoint if dist else tf.train.Checkpoint
    ckpt_path = Checkpoint(model=model, optimizer=model.optimizer).save(
        os.path.join(out_dir, "checkpoint", "ctr"))
    fresh = build_model(args.features, args.dim, args.learning_rate, dist)
    fresh.optimizer.build(fresh.trainable_variables)
    Checkpoint(model=fresh, optimizer=fresh.optimizer).restore(
        ckpt_path).assert_existing_objects_matched()
    restored = fresh.predict(as_inputs(batch), verbose=0).reshape(-1)
    fresh_sizes = [int(fresh.get_layer(f"{n}_emb").params.size())
                   for n in feature_names(args.features)]
    timings["checkpoint"] = time.perf_counter() - t
    results["restored_identical"] = bool(np.array_equal(live, restored) and fresh_sizes == sizes)
    print(f"\nCheckpoint {ckpt_path} ({_du(os.path.dirname(ckpt_path)) / 1e6:.1f} MB: tables "
          f"with Adam slots, dense weights, optimizer step {int(model.optimizer.iterations)})")
    print(f"  restored into a fresh model: table sizes {fresh_sizes}, identical predictions: "
          f"{results['restored_identical']}")

    # 5. export for serving -> a process with TensorFlow only ------------------------------
    t = time.perf_counter()
    export_dir = de.export_for_serving(model, os.path.join(out_dir, "serving"))
    timings["export"] = time.perf_counter() - t
    t = time.perf_counter()
    if rank == 0:
        served, info = serve_in_fresh_process(export_dir, as_inputs(batch), out_dir)
    else:
        served, info = live, {}
    if dist:                             # every rank reports what rank 0 served
        served, info = hvd.broadcast_object((served, info), 0)
    timings["serve"] = time.perf_counter() - t
    served = served.reshape(-1)
    results["served_max_abs_diff"] = float(np.max(np.abs(served - live)))
    results["served_match"] = bool(np.allclose(served, live, rtol=1e-5, atol=1e-6))
    print(f"\nSavedModel {export_dir} ({_du(export_dir) / 1e6:.1f} MB) loaded in a fresh process "
          f"(TensorFlow {info['tensorflow']} only; signature inputs {info['signature inputs']})")
    print("   row  first id               served   model.predict  true p")
    for i in list(range(min(3, len(batch) - 1))) + [len(batch) - 1]:
        p = "(new ids)" if i == len(batch) - 1 else f"{prob[n_train + i]:.4f}"
        print(f"  {i:>4}  {batch[i, 0]:>21}  {served[i]:.5f}  {live[i]:.5f}        {p}")
    print(f"  served == model.predict on {len(batch)} rows: {results['served_match']} "
          f"(max abs diff {results['served_max_abs_diff']:.1e})")

    results["timings"] = timings
    results["table_sizes"] = sizes
    return results


def _du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


if __name__ == "__main__":
    res = main()
    problems = [what for what, bad in [
        ("the model's AUC is not clearly above the constant's",
         res["auc_model"] <= res["auc_baseline"] + 0.05),
        ("the restored model predicts differently", not res["restored_identical"]),
        ("the served scores differ from model.predict", not res["served_match"])] if bad]
    for what in problems:
        print(f"FAILED: {what}", file=sys.stderr)
    sys.exit(1 if problems else 0)
