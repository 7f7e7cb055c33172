"""The exercises' checks, one module per notebook, importable by the notebooks and by a
student copy that has no solutions.

The convention every notebook follows
-------------------------------------
Files
    ``notebooks/checks/NN_name.py``     the checks of notebook ``NN_name.ipynb``, nothing else.
                                        A check module never imports ``solutions``; it may
                                        import ``linattn`` and ``checks._exercises``.
    ``notebooks/solutions/NN_name.py``  our answers only, under the names the notebook's
                                        stubs use. Nothing but the tests imports it.
    ``notebooks/checks/_exercises.py``  ``report``, the shared runner every check calls.

An answer is always a function
    The student writes a function (a prediction is a function that returns the predicted
    values), and the check calls it. The stub's body is
    ``raise NotImplementedError  # your code here``.

A check: ``check_exercise_N(answer, ...)``, written as ``report(N, _check_N, answer, ...)``
    prints ``Exercise N: correct`` when every test passes (and returns None);
    raises ``AssertionError`` whose message says what is wrong (which input, which value,
    and a hint), never a bare assert;
    prints ``Exercise N: not attempted yet ...`` while the answer raises NotImplementedError.
    A check tells a wrong answer from a right one: the tests give it one of each.

In the notebook
    The checks load once, near the top::

        import importlib
        checks = importlib.import_module("checks.NN_name")   # a module name cannot start
                                                             # with a digit in an import
    Each exercise is a markdown cell that states it (what to derive, implement or predict,
    and what the check will test), then ONE code cell whose metadata has
    ``"tags": ["exercise"]``: the stub(s), ending with ``checks.check_exercise_N(stub, ...)``.
    No cell of a notebook imports ``solutions``. The committed notebook shows the stub and
    its "not attempted yet" output.

The student copy
    ``python notebooks/student.py OUTDIR`` (``make student`` writes ``student/``) copies the
    notebooks with the outputs of the ``exercise`` cells cleared, and ``checks/``, without
    ``solutions/``.

The tests
    ``tests/test_exercises_NN_MM.py``: for each exercise our solution passes its check, a
    wrong answer fails it with AssertionError, and a stub raising NotImplementedError prints
    "not attempted yet". ``tests/test_student.py`` runs every notebook of the student copy
    and finds every exercise cell not attempted yet.
"""
