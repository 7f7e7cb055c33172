"""Argument types and the parser every command line of linattn uses (``python -m linattn
train|generate|warmup`` and the lab's ``bench``, ``figures``, ``speed`` and benchmarks).

A user's mistake is one line on stderr, naming the flag, what it got and what it takes, and
exit status 2 (argparse's convention), before any work and before anything is written:

    python -m linattn generate: error: argument --n: must be a positive integer, got '0'

The types raise ``argparse.ArgumentTypeError``; argparse adds the flag's name. Checks that
involve several flags (--min-n <= --max-n, a checkpoint that --resume needs) call
``Parser.error`` with the flags named.
"""
import argparse
import math
import os
import shutil
import sys


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line: no usage block above it (``-h``
    prints the usage), so that a mistake reads as one sentence and exit status 2."""

    def error(self, message):
        """Print ``PROG: error: MESSAGE (PROG -h: the options)`` on stderr and exit with 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _integer(text):
    """``text`` as an int, or an ArgumentTypeError that quotes it."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _number(text):
    """``text`` as a finite float, or an ArgumentTypeError that quotes it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_int(text):
    """An integer >= 1 (a count or a size)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text):
    """An integer >= 0 (a seed, a number of warm-up steps)."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def positive_float(text):
    """A finite number > 0 (a rate, a time budget)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_float(text):
    """A finite number >= 0 (a temperature, a pause, a noise level, a clip norm)."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def existing_file(text):
    """A path to a file that exists."""
    if not os.path.isfile(text):
        what = "a directory" if os.path.isdir(text) else "nothing"
        raise argparse.ArgumentTypeError(f"must be an existing file, got {text!r} "
                                         f"({what} there)")
    return text


def executable(text):
    """A path to an executable file, or the name of one on PATH (an interpreter)."""
    if shutil.which(text) is None:
        raise argparse.ArgumentTypeError(f"must be an executable (a Python interpreter), got "
                                         f"{text!r}: no such program")
    return text


def new_file(text):
    """A path to write: its directory exists and it is not a directory itself."""
    folder = os.path.dirname(text) or "."
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"must be a file to write, got {text!r}, a directory")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"must be a file in an existing directory, got "
                                         f"{text!r}: no directory {folder!r}")
    return text


def output_file(text):
    """A path to write, whose missing folders are created: not a directory itself."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"must be a file to write, got {text!r}, a directory")
    return text


def out_dir(text):
    """A directory to write into: it may not exist yet, but it is not a file."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"must be a directory, got {text!r}, a file")
    return text


def die(prog, message):
    """A user's mistake found after parsing (a corrupt checkpoint): one line, exit 2."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(2)
