"""The command line: ``python -m linattn COMMAND [options]``; ``--help`` lists the commands.

The library's commands (``train``, ``generate``, ``warmup``) and the lab's (``bench``,
``figures``, ``speed``) share this entry point; the lab is imported only when one of its
commands runs. Before any work the process is relaunched once with the thread settings of
``linattn.threads`` in its environment (OpenBLAS reads them only when it loads).
"""
import importlib
import sys

from ._cli_types import Parser

# command: (module, function, one line of help)
COMMANDS = {
    "train": ("linattn.model.cli", "train_main",
              "train a model: copy, digits or speech (python -m linattn train --help)"),
    "generate": ("linattn.model.cli", "generate_main",
                 "generate from a trained checkpoint"),
    "warmup": ("linattn.warmup", "main",
               "compile the common Numba kernels now (once per machine: about a minute)"),
    "bench": ("linattn.lab.bench", "main",
              "the lab: time and memory against N, head to head with the peers"),
    "figures": ("linattn.lab.figures", "main",
                "the lab: regenerate figures/ from fresh measurements"),
    "speed": ("linattn.lab.speed", "main",
              "the lab: generation speed at the paper's MNIST shape"),
}


def _parser():
    ap = Parser(
        prog="python -m linattn",
        description="Transformers are RNNs, in NumPy: train and generate with the model, "
                    "or measure it (the lab's commands).",
        epilog="python -m linattn COMMAND --help describes each command.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, _, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return ap


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        _parser().parse_args(argv)          # --help lists the commands; else exits 2
    module, function, _ = COMMANDS[argv[0]]
    return getattr(importlib.import_module(module), function)(argv[1:])


if __name__ == "__main__":
    from linattn import threads
    threads.relaunch_configured()
    sys.exit(main())
