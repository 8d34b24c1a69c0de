"""Checkpoints and serving of a model trained under mpiexec, across world sizes.

One test, three launches: ``mpiexec -n 2`` trains a model with split tables, saves
``hvd.Checkpoint`` and ``hvd.save_model`` (.keras) and exports a SavedModel; ``mpiexec -n 3``
restores the checkpoint and loads the .keras file (each rank keeps the keys it owns); one
process does both too (every key) and serves the SavedModel (its graph holds TensorFlow
ops alone).  Every copy must give the same tables, dense weights and predictions.
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mpi4py")
from tests.mpi_launch import MARKS, MPIEXEC  # noqa: E402

pytestmark = MARKS

COMMON = """
import os, sys, numpy as np, tensorflow as tf, keras
import tf_bridge as de
from tf_bridge import distributed as hvd
hvd.init()
R, N = hvd.rank(), hvd.size()
OUT = sys.argv[1]

def build():
    keras.utils.set_random_seed(1)
    ids = keras.Input((2,), dtype="int64")
    e = de.keras.layers.Embedding(3, name="emb", combiner="sum", distributed=True,
                                  initializer=keras.initializers.RandomNormal(0, 0.1, seed=3))(ids)
    model = keras.Model(ids, keras.layers.Dense(1)(e))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05))
    model.compile(hvd.DistributedOptimizer(opt), loss="mse")
    return model

def merged(model):
    keys, rows = (np.asarray(a) for a in model.get_layer("emb").params.export())
    every = hvd.allgather_object((keys, rows))
    k = np.concatenate([a for a, _ in every]); r = np.concatenate([b for _, b in every])
    order = np.argsort(k)
    return k[order], r[order]

BATCH = np.array([[0, 1], [-1, 2**63 - 1], [-2**63, 5], [123456789, 7]], np.int64)
"""

TRAIN = COMMON + """
model = build()
x = np.random.default_rng(R).integers(-20, 20, (8, 2))
model.fit(x, np.ones((8, 1)), batch_size=4, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
x[0] = [-2**63, 2**63 - 1]
model.fit(x, np.zeros((8, 1)), batch_size=4, verbose=0)
try:
    tf.train.Checkpoint(model=model).save(os.path.join(OUT, "plain"))
    raise SystemExit("a plain tf.train.Checkpoint saved a split table")
except ValueError as e:
    assert "tf_bridge.distributed.Checkpoint" in str(e)
try:
    model.save(os.path.join(OUT, "plain.keras"))
    raise SystemExit("a plain model.save saved a split table")
except ValueError as e:
    assert "tf_bridge.distributed.save_model" in str(e)
hvd.save_model(model, os.path.join(OUT, "model.keras"))
path = hvd.Checkpoint(model=model, optimizer=model.optimizer).save(os.path.join(OUT, "ckpt"))
de.export_for_serving(model, os.path.join(OUT, "serving"))
keys, rows = merged(model)
pred = model.predict(BATCH, verbose=0)
if R == 0:
    np.savez(os.path.join(OUT, "want.npz"), keys=keys, rows=rows, pred=pred,
             dense=model.layers[-1].get_weights()[0], path=path)
"""

RESTORE = COMMON + """
from tf_bridge.checkpoint import table_state
want = np.load(os.path.join(OUT, "want.npz"))
model = build()
model.optimizer.build(model.trainable_variables)
hvd.Checkpoint(model=model, optimizer=model.optimizer).restore(str(want["path"]))
keys, rows = merged(model)
assert np.array_equal(keys, want["keys"]), (keys, want["keys"])
assert np.allclose(rows, want["rows"], atol=1e-6)
assert np.allclose(model.layers[-1].get_weights()[0], want["dense"])
assert np.allclose(model.predict(BATCH, verbose=0), want["pred"], atol=1e-6)
local = np.asarray(model.get_layer("emb").params.export()[0])
assert (local.view(np.uint64) % np.uint64(N) == R).all() if N > 1 else True
print(f"rank {R} of {N}: restored {local.size} of {keys.size} keys", flush=True)

# the .keras file of hvd.save_model: the same rows and Adam slots on this rank
loaded = hvd.load_model(os.path.join(OUT, "model.keras"))     # keras.models.load_model + hvd
assert np.allclose(loaded.predict(BATCH, verbose=0), want["pred"], atol=1e-6)
a, b = (table_state(m.get_layer("emb").params) for m in (model, loaded))
assert a["columns"] == b["columns"] and "Adam" in a["columns"], (a["columns"], b["columns"])
ia, ib = np.argsort(a["keys"]), np.argsort(b["keys"])
for name in ("keys", "values", "column_bytes"):
    assert np.array_equal(a[name][ia], b[name][ib]), name
assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) > 0
loaded.fit(BATCH, np.ones((4, 1)), verbose=0)             # it trains on: optimizer distributed
model.fit(BATCH, np.ones((4, 1)), verbose=0)
assert np.allclose(loaded.predict(BATCH, verbose=0), model.predict(BATCH, verbose=0), atol=1e-5)
print(f"rank {R} of {N}: loaded model.keras", flush=True)
"""


def run(cmd, out, script):
    path = out / "job.py"
    path.write_text(script)
    proc = subprocess.run(cmd + [str(path), str(out)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_train_on_2_restore_on_3_and_on_1_serve_with_tf_only(tmp_path):
    mpi = [MPIEXEC, "-n"]
    run(mpi + ["2", sys.executable, "-m", "mpi4py"], tmp_path, TRAIN)
    ckpt = os.listdir(tmp_path)
    assert "ckpt-1.index" in ckpt and "ckpt-1.tables" in ckpt and "plain-1.index" not in ckpt
    tables = os.listdir(tmp_path / "ckpt-1.tables")
    assert len(tables) == 1 and len(os.listdir(tmp_path / "ckpt-1.tables" / tables[0])) == 3
    assert "model.keras" in ckpt     # (a refused model.save leaves what Keras opened)
    out = run(mpi + ["3", sys.executable, "-m", "mpi4py"], tmp_path, RESTORE)
    assert out.count("restored") == 3 and out.count("loaded model.keras") == 3
    serve = textwrap.dedent("""
    loaded = tf.saved_model.load(os.path.join(OUT, "serving"))
    got = loaded.serve(tf.constant(BATCH)).numpy()
    assert np.allclose(got, want["pred"], atol=1e-6), (got, want["pred"])
    print("served")
    """)
    out = run([sys.executable], tmp_path, RESTORE + serve)      # one process: every key
    assert "rank 0 of 1" in out and "loaded model.keras" in out and "served" in out
