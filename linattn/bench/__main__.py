"""``python -m linattn.bench``; see the package docstring."""
import sys

from . import main

sys.exit(main())
