"""The exercises' checks, one module per notebook (``checks.NN_name``), importable by the
notebooks and by a student copy that has no solutions."""
