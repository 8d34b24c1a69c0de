"""Shared by the tests that check a Keras model end to end: reloaded from ``.keras``
and served from a SavedModel by a fresh process without numbaemb."""
import subprocess
import sys
import textwrap

import numpy as np

# the fresh process: numbaemb, jit_kernels and tf_bridge cannot be imported there
SERVE = """
import sys
sys.modules["numbaemb"] = None; sys.modules["jit_kernels"] = None; sys.modules["tf_bridge"] = None
import numpy as np, tensorflow as tf
m = tf.saved_model.load(sys.argv[1])
x = tf.constant(np.load(sys.argv[2], allow_pickle=True)["x"])
out = {"serve": tf.cast(m.serve(x), tf.float32).numpy()}
sig = m.signatures["serving_default"]
name = list(sig.structured_input_signature[1])[0]
out["signature"] = tf.cast(sig(**{name: x})["output_0"], tf.float32).numpy()
np.savez(sys.argv[3], **out)
"""


def reload_and_serve(model, query, tmp_path, feed=lambda q: q):
    """``model``'s predictions for ``query`` (numpy, fed as ``feed(query)``), after
    checking that the ``.keras`` reload predicts the same; returns ``(want, served)``,
    ``served`` the fresh process's ``serve`` and signature outputs."""
    from tf_bridge import export_for_serving
    import keras
    want = model.predict(feed(query), verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.predict(feed(query), verbose=0), want)
    export_for_serving(model, str(tmp_path / "sm"))
    np.savez(tmp_path / "in.npz", x=query)
    (tmp_path / "serve.py").write_text(textwrap.dedent(SERVE))
    subprocess.run([sys.executable, str(tmp_path / "serve.py"), str(tmp_path / "sm"),
                    str(tmp_path / "in.npz"), str(tmp_path / "out.npz")], check=True,
                   capture_output=True, timeout=300)
    return want, dict(np.load(tmp_path / "out.npz"))
