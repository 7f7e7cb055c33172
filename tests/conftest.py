"""Fixtures and the hypothesis profiles; the helpers the tests import are in ``helpers.py``.

The ``ci`` profile (the default) is derandomized, so every run draws the same examples, and
has no deadline, since Numba compiles on first call. ``HYPOTHESIS_PROFILE=dev`` explores more.
"""
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=40,
                          print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
