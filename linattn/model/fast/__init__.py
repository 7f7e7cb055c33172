"""The compiled training and generation path, held to the reference model of
``linattn.model`` by the tests: the same functions computed with fewer passes over memory.

- ``fused``: training's element work as parallel Numba loops (GELU with its bias, the one
  compiled GELU gate, layer norm with its residual add, the heads split from the
  projections and joined back, the embedding's backward);
- ``attention``: the attention layer with Q, K and V from one matrix product;
- ``lean``: the transformer's forward and backward over those, with the activations kept;
- ``optim``: Adam's update, one compiled pass a parameter;
- ``token_loop``: the token loop behind ``generate``'s "recurrent" and "cache" methods,
  and ``token_kernels``, its element work between the matrix products.

Each names its reference. ``linattn.model.paths`` chooses between this path ("lean", the
default) and the reference ("reference"), in one place.
"""
