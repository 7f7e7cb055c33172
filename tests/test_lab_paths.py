"""The scripts the lab hands to a peer interpreter exist where the lab looks for them (the
peers run them by path, so a moved file only shows as a peer that failed)."""
import os

import pytest

from linattn.lab import speed
from linattn.lab.bench import lsh_peer, train_step
import linattn.lab.bench as bench


@pytest.mark.parametrize("path", [
    speed.PEER_SCRIPT,                                            # generation: pft's RNN
    train_step.PEER,                                              # one training step
    os.path.join(os.path.dirname(bench.__file__), "peers.py"),    # the benchmark's peers
    os.path.abspath(lsh_peer.__file__),                           # lsh against pft
])
def test_peer_script_exists(path):
    assert os.path.isfile(path), path
    assert os.path.basename(os.path.dirname(path)) == "bench"
