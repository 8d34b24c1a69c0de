"""TensorFlow bridge: ``import tf_bridge as de`` gives TFRA's dynamic_embedding names.

No compiled ops: tables are numbaemb's, tensors cross by DLPack (eager) or
``tf.numpy_function`` (inside ``tf.function``).

    user = de.get_variable("user", dim=16,
                           initializer=tf.keras.initializers.RandomNormal(stddev=0.05))
    with tf.GradientTape() as tape:
        e = de.embedding_lookup(user, ids)            # ids: int64/int32, any shape
        loss = ...
    grads = tape.gradient(loss, [user])               # [tf.IndexedSlices(rows, keys)]

>>> import tensorflow as tf, tf_bridge as de
>>> v = de.get_variable("doc_init", dim=3)
>>> de.embedding_lookup(v, tf.constant([1, 2], tf.int64)).shape
TensorShape([2, 3])
"""
from . import dlpack, initializers
from .lookup import (embedding_lookup, embedding_lookup_sparse, embedding_lookup_unique,
                     safe_embedding_lookup_sparse)
from .mode import (ModelMode, enable_inference_mode, enable_train_mode, get_model_mode,
                   is_training)
from .variable import Variable, get_variable, owner_of
from . import tf_nn  # noqa: E402,F401  (tf.nn's lookups accept our variables)
from .kv_variable import get_kv_variable  # noqa: E402  (DeepRec's name)

__all__ = ["Variable", "get_variable", "embedding_lookup", "embedding_lookup_unique",
           "embedding_lookup_sparse", "safe_embedding_lookup_sparse", "ModelMode",
           "enable_train_mode", "enable_inference_mode", "get_model_mode", "is_training",
           "owner_of", "dlpack", "initializers", "get_kv_variable"]

# Checkpoints (tf.train.Checkpoint, Keras .keras files) and serving export.
from . import checkpoint  # noqa: E402
from .export import export_for_serving  # noqa: E402
from .graph_export import export_graph_for_serving  # noqa: E402

__all__ += ["checkpoint", "export_for_serving", "export_graph_for_serving"]

# Training: optimizer wrapper, Keras layer (de.keras.layers.Embedding), restrict policies.
from . import keras  # noqa: E402
from .optimizer import DynamicEmbeddingOptimizer  # noqa: E402
from .restrict import (FrequencyRestrictPolicy, RestrictPolicy,  # noqa: E402
                       TimestampRestrictPolicy)

__all__ += ["keras", "DynamicEmbeddingOptimizer", "RestrictPolicy", "TimestampRestrictPolicy",
            "FrequencyRestrictPolicy"]

# Dynamic vocabularies for TF's TPU embedding API (de.tpu.DynamicTPUEmbedding).
from . import tpu  # noqa: E402

__all__ += ["tpu"]

# Training on several processes (MPI): Horovod's names (tf_bridge.distributed).
from . import distributed, sok  # noqa: E402

__all__ += ["distributed", "sok"]
