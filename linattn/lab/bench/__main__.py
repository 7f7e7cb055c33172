"""``python -m linattn.lab.bench``; see the package docstring."""
import sys

from linattn import threads

threads.relaunch_configured()           # OpenBLAS reads its thread timeout when it loads
from . import main  # noqa: E402

sys.exit(main())
