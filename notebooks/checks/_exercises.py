"""What every notebook's exercise checks share: ``report`` runs a student's answer and says
when it is not written yet (it still raises NotImplementedError, the notebook's starting
point) instead of failing. The check modules import it as
``from checks._exercises import report``; the convention is in ``checks/__init__.py``."""
import pathlib


def report(exercise, check, *answers):
    """Run ``check(*answers)`` and print the verdict: an answer still raising
    NotImplementedError is not attempted yet; a wrong one raises AssertionError."""
    try:
        check(*answers)
    except NotImplementedError:
        print(f"Exercise {exercise}: not attempted yet (your answer raises "
              "NotImplementedError); write it and rerun the cell.")
    else:
        print(f"Exercise {exercise}: correct")


def attempter(solution_file):
    """``attempt(number, fn, *args)``: fn(*args), or None and a note pointing at
    ``solution_file`` (the calling module's ``__file__``) while fn is not written yet."""
    name = pathlib.Path(solution_file).name

    def attempt(number, fn, *args):
        try:
            return fn(*args)
        except NotImplementedError:
            print(f"exercise {number}: not written yet (a solution is in "
                  f"notebooks/solutions/{name})")
            return None
    return attempt
