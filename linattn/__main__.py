"""The command line: ``python -m linattn {bench,figures,train,generate,speed} [options]``."""
import sys

from . import bench, figures
from .model import cli

COMMANDS = {"bench": bench.main, "figures": figures.main, "train": cli.train_main,
            "generate": cli.generate_main, "speed": cli.speed_main}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m linattn {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
