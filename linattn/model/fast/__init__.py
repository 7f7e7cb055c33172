"""The compiled training and generation path, held to the reference model of
``linattn.model`` by the tests: the same functions computed with fewer passes over memory.

- ``fused``: the element work as parallel Numba loops (GELU with its bias, layer norm with
  its residual add, the heads' split and merge, embedding backward, Adam);
- ``lean``: the transformer block's forward and backward over those loops, with the
  activations it keeps;
- ``decode``: the lean token loop behind ``generate``'s "recurrent" and "cache" methods.

``TrainConfig(path=...)`` chooses between this path ("lean", the default) and the
reference ("reference") in one place, ``linattn.model.transformer.loss_and_grads``.
"""
