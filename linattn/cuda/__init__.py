"""The CuPy backend: our own CUDA C kernels (``*.cu`` beside this file), compiled by CuPy at
first use and launched with ``cupy.RawModule``.

- ``launch``: the checks a ``backend="cupy"`` call needs (CuPy, a GPU, CuPy arrays), and
  compiling and launching the sources;
- ``cumulative`` (v1, one thread per column walks the sequence) and ``chunked`` (v2, a chunked
  scan): the kernel pair ``attend``/``attend_backward`` of causal linear attention;
- ``step``: the RNN step for many sequences at once;
- ``softmax``: softmax attention, CuPy matrix products around a row-softmax kernel.

Nothing here imports CuPy at import time. The oracle of every function is the NumPy backend.
"""
