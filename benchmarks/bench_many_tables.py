"""A model with many small tables (a Criteo-like CTR model): the cost of one hand-off into
Python per table per step, and what one lookup op and one optimizer call for all tables
save.

26 categorical features, each its own ``de.keras.layers.Embedding(16)`` table, batches of
4,096 rows (one id per feature per row, Zipf(1.2) over 100K ids per feature), the 26
embeddings concatenated into ``Dense(1, sigmoid)``, BCE, Adam.  Four models train in one
process, in alternating chunks, so all see the same load:

* ``one op``: one ``de.keras.layers.MultiEmbedding`` holds the 26 tables and looks them
  all up in one ``tf.numpy_function`` a step; the optimizer as ``batched``;
* ``batched``: ``DynamicEmbeddingOptimizer`` applies all 26 tables in one
  ``tf.numpy_function`` a step (``tf_bridge.optimizer.BATCHED = True``, the default);
* ``per table``: one call per table (``BATCHED = False``, the code before);
* ``limit``: the same model with 26 embeddings that cost nothing (constant rows; TF
  still computes their gradients), the machine's limit for this job.

    python benchmarks/bench_many_tables.py            # about a minute (80 warm-up steps)
    python benchmarks/bench_many_tables.py --chunks 3 --steps 10   # smoke run
"""
import argparse
import os
import statistics
import sys
import time

FEATURES, DIM, BATCH, VOCAB = 26, 16, 4096, 100_000


def build(kind):
    import keras
    import numpy as np
    import tensorflow as tf
    import tf_bridge as de
    inp = keras.Input((FEATURES,), dtype="int64")
    feats = [keras.layers.Lambda(lambda x, f=f: x[:, f:f + 1])(inp) for f in range(FEATURES)]
    if kind == "one op":
        embs = de.keras.layers.MultiEmbedding([DIM] * FEATURES, name="one_op")(feats)
    elif kind == "limit":
        embs = [_Free(name=f"free_{f}")(ids) for f, ids in enumerate(feats)]
    else:
        embs = [de.keras.layers.Embedding(DIM, name=f"{kind.replace(' ', '_')}_{f}")(ids)
                for f, ids in enumerate(feats)]
    cols = [e if kind == "limit" else keras.layers.Flatten()(e) for e in embs]
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()(cols))
    model = keras.Model(inp, out)
    opt = keras.optimizers.Adam(1e-3)
    model.compile(opt if kind == "limit" else de.DynamicEmbeddingOptimizer(opt),
                  loss="binary_crossentropy")
    del np, tf
    return model


def _free_layer():
    import keras
    import numpy as np
    import tensorflow as tf

    class Free(keras.layers.Layer):
        """Constant rows whatever the ids; its weight's gradient reads one number of the
        incoming gradient, so TensorFlow still computes it whole."""

        def build(self, shape):
            self.w = self.add_weight(shape=(1,), initializer="zeros", name="w")
            self.rows = tf.constant(np.random.default_rng(0).normal(
                0, 0.05, (BATCH, DIM)).astype(np.float32))

        def call(self, ids):
            rows = self.rows

            @tf.custom_gradient
            def embed(w):
                return tf.identity(rows), lambda dy: tf.reshape(dy[0, 0], (1,))
            return embed(self.w)
    return Free


_Free = None


def main(argv=None):
    global _Free
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30, help="steps a chunk")
    ap.add_argument("--warmup", type=int, default=80,
                    help="steps before timing: the tables grow (inserts, page faults) early on")
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    import tf_bridge.optimizer as top
    _Free = _free_layer()
    n = args.warmup + args.chunks * args.steps
    rng = np.random.default_rng(0)
    x = (rng.zipf(1.2, (n, BATCH, FEATURES)) % VOCAB).astype(np.int64)
    y = (rng.random((n, BATCH, 1)) < 0.3).astype(np.float32)
    kinds = ["one op", "batched", "per table", "limit"]
    models, at, times = {}, {}, {k: [] for k in kinds}
    for k in kinds:
        top.BATCHED = k != "per table"            # read when the step is traced
        models[k], at[k] = build(k), 0

    def fit(k, steps, record):
        top.BATCHED = k != "per table"
        a, b = at[k], at[k] + steps
        at[k] = b
        ds = tf.data.Dataset.from_tensor_slices((x[a:b], y[a:b])).prefetch(2)
        t = time.perf_counter()
        models[k].fit(ds, epochs=1, verbose=0, shuffle=False)
        if record:
            times[k].append((time.perf_counter() - t) / steps * 1e3)

    for k in kinds:
        fit(k, args.warmup, False)
    for _ in range(args.chunks):
        for k in kinds:
            fit(k, args.steps, True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ids = BATCH * FEATURES
    print(f"{FEATURES} tables of dim {DIM}, batches of {BATCH} rows ({ids:,} ids a step), "
          f"{args.chunks} chunks of {args.steps} steps, median of chunks (fit() per chunk, "
          f"tracing excluded); load average {os.getloadavg()[0]:.2f}")
    print("| model | ms a step | ids/s | vs per table | vs limit |")
    print("|---|---:|---:|---:|---:|")
    for k in kinds:
        print(f"| {k} | {med[k]:.2f} | {ids / med[k] * 1e3 / 1e6:.2f}M | "
              f"{med['per table'] / med[k]:.2f}x | {med['limit'] / med[k]:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
