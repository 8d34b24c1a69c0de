"""Keras / TF initializers -> numbaemb's deterministic per-key initializers.

``translate(init)`` returns a :mod:`numbaemb.initializers` object for Zeros,
Ones, Constant, RandomNormal, RandomUniform and TruncatedNormal (Keras 3's
``tf.keras.initializers.*`` and TF's ``tf.*_initializer``), keeping their
parameters and seed (``seed=None`` -> numbaemb's default: a hash of the
variable's name).  Their values are then a pure function of (seed, key, column),
so the same key gets the same row whatever the batch (TF's random initializers
draw per call).  ``None``, numbers, arrays and constant tensors become
``Zeros`` / ``Constant``.  Any other callable is returned as is: the variable
calls it with ``shape=(n, dim)`` for the ``n`` missing keys of a lookup.

>>> import tensorflow as tf
>>> translate(tf.keras.initializers.RandomNormal(stddev=0.05, seed=3))
RandomNormal(mean=0.0, stddev=0.05, seed=3)
>>> translate(tf.keras.initializers.Ones())
Constant(value=1.0)
"""
import numpy as np
import tensorflow as tf

from numbaemb import initializers as ne_init

__all__ = ["translate"]

_BY_NAME = {
    "Zeros": lambda c: ne_init.Zeros(),
    "Ones": lambda c: ne_init.Constant(1.0),
    "Constant": lambda c: ne_init.Constant(_value(c.get("value", 0.0))),
    "RandomNormal": lambda c: ne_init.RandomNormal(
        mean=float(c.get("mean", 0.0)), stddev=float(c.get("stddev", 0.05)), seed=_seed(c)),
    "TruncatedNormal": lambda c: ne_init.TruncatedNormal(
        mean=float(c.get("mean", 0.0)), stddev=float(c.get("stddev", 0.05)), seed=_seed(c)),
    "RandomUniform": lambda c: ne_init.RandomUniform(   # TF1's maxval=None: 1 (floats)
        minval=_float(c.get("minval", -0.05), 0.0), maxval=_float(c.get("maxval", 0.05), 1.0),
        seed=_seed(c)),
}
# Keras 3 and TF-core (init_ops_v2) initializer modules whose classes we know by name.
_MODULES = ("keras.", "tensorflow.python.ops.init_ops", "tf_keras.")


def _float(value, default):
    return default if value is None else float(value)


def _seed(config):
    seed = config.get("seed")
    return int(seed) if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) else None


def _value(value):
    if isinstance(value, dict):          # a serialized Keras tensor config
        value = value.get("config", {}).get("value", value)
    return np.asarray(value, np.float64)


def translate(initializer):
    """A ``numbaemb.initializers.Initializer`` for the known kinds, else a callable.

    Raises:
      TypeError: ``initializer`` is neither None, a number, an array, a tensor nor callable.
    """
    if initializer is None or isinstance(initializer, ne_init.Initializer):
        return ne_init.get(initializer)
    if isinstance(initializer, (tf.Tensor, tf.Variable)):
        initializer = np.asarray(initializer)
    if not callable(initializer):
        try:
            return ne_init.get(initializer)
        except TypeError:
            raise TypeError("initializer must be None, a number, an array of shape (dim,), a "
                            "Keras/TF initializer or a callable f(shape, dtype), got "
                            f"{type(initializer).__name__}") from None
    cls = type(initializer)
    make = _BY_NAME.get(cls.__name__)
    if make is not None and cls.__module__.startswith(_MODULES) and hasattr(initializer, "get_config"):
        return make(initializer.get_config())
    return initializer
