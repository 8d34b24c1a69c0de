"""``de.keras.layers``: the dynamic ``Embedding`` layer (see :mod:`tf_bridge.keras_layers`),
``MultiEmbedding`` (many tables, one lookup op: :mod:`tf_bridge.keras_multi`)
and TFRA's ``SquashedEmbedding``, ``FieldWiseEmbedding`` and ``HvdAllToAllEmbedding``
(see :mod:`tf_bridge.keras_tfra_layers`)."""
from ..keras_layers import Embedding
from ..keras_multi import MultiEmbedding
from ..keras_tfra_layers import FieldWiseEmbedding, HvdAllToAllEmbedding, SquashedEmbedding

BasicEmbedding = Embedding          # TFRA's other name for it

__all__ = ["Embedding", "MultiEmbedding", "BasicEmbedding", "SquashedEmbedding",
           "FieldWiseEmbedding", "HvdAllToAllEmbedding"]
