"""How the compiled LSH attention (``numba_cpu.lsh``) walks a round's sorted positions: a
chunk's window (the chunk and the one before it), runs of ``RUN`` consecutive chunks that
one parallel unit walks in order, and the rows it gathers and scatters on the way. A
chunk's rows, gathered as its queries and own keys, slide over to become the next chunk's
previous keys, so each row is gathered once a round. Kitaev et al. (2020),
arXiv:2001.04451, section 2; the reference is ``forms.lsh`` (NumPy), which gathers whole
rounds at once.

``order`` below is one row of one round's sorted positions, or its first L entries, the
real positions of a padded row: a window never reaches past it.
"""
from numba import njit

RUN = 8          # consecutive chunks a parallel unit walks, sharing the rows it gathered


@njit(cache=True, error_model="numpy")
def gather_rows(x, positions, out):
    """out[a] = x[positions[a]]: rows of x (N, W) into out (len, W)."""
    for a in range(positions.size):
        j = positions[a]
        for e in range(x.shape[1]):
            out[a, e] = x[j, e]
    return out


@njit(cache=True, error_model="numpy")
def chunk_window(order, ch, c):
    """A chunk's queries, its sorted positions mid .. end, and its window's keys, lo .. end
    (the previous chunk's, then its own), in a round's order (N,): (mid, lo, end)."""
    mid = ch * c
    return mid, max(mid - c, 0), min(mid + c, order.size)


@njit(cache=True, error_model="numpy")
def chunk_runs(n, c):
    """(chunks, runs): a row's chunks and the runs of ``RUN`` consecutive chunks."""
    n_chunks = -(-n // c)
    return n_chunks, -(-n_chunks // RUN)


@njit(cache=True, error_model="numpy")
def slide_window(window, ch, c):
    """Before chunk ch of a run: the rows window (2C, W) held for chunk ch - 1's own keys
    (from row C, or row 0 for chunk 0, whose window has no previous chunk) become ch's
    previous keys, rows 0 .. C."""
    before = c if ch > 1 else 0
    window[:c] = window[before:before + c]


@njit(cache=True, error_model="numpy")
def load_window(window, x, order, ch, c, first):
    """Rows of x (N, W) for chunk ch's window into window (2C, W), the previous chunk's then
    its own, in the round's order (N,): slid from chunk ch - 1's when the run walked it
    (first: the run's first chunk), else gathered. Returns the filled rows."""
    mid, lo, end = chunk_window(order, ch, c)
    if ch > first:
        slide_window(window, ch, c)
    else:
        gather_rows(x, order[lo:mid], window[:mid - lo])
    gather_rows(x, order[mid:end], window[mid - lo:end - lo])
    return window[:end - lo]


@njit(cache=True, error_model="numpy")
def scatter_add_rows(x, positions, rows):
    """x[positions[a]] += rows[a] for every a (distinct positions)."""
    for a in range(positions.size):
        x_a = x[positions[a]]
        for e in range(x.shape[1]):
            x_a[e] += rows[a, e]
