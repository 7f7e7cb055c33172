"""The lab: what measures linattn against its peers and draws the figures. It imports the
library; nothing in the library imports it.

- ``bench``: time and memory against N for every form of attention, head to head with the
  peers (PyTorch, pytorch-fast-transformers) in rounds; the training step (``train_step``)
  and the GPU benchmark (``gpu``); the peers' scripts run in their own interpreter.
- ``measure``: the rows of each figure (each function measures, the figures only draw).
- ``figures``: rows -> PNG and CSV; ``python -m linattn.lab.figures`` regenerates
  ``figures/`` (``make figures``).
- ``rounding``: the RNN state summed sequentially, in chunks and compensated (notebooks 09,
  11).
- ``speed``: generation speed at the paper's MNIST shape (Tables 1, 4 and 5).
- ``gpu_check.sh``: the GPU tests, sanitizers and benchmark for a lent device.

The lab's entry points apply the thread settings of ``linattn.threads``.
"""
