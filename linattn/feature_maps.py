"""Feature maps phi for kernelized attention, section 3.2 of Katharopoulos et al. (2020),
"Transformers are RNNs", arXiv:2006.16236.

A feature map turns a query or key x of shape (..., D) into positive features phi(x) of
shape (..., F), so that sim(q, k) = phi(q) . phi(k) (Eq. 4). Each map has two methods:

- ``forward(x) -> phi``: the features, shape (..., F);
- ``vjp(x, dphi) -> dx``: the vector-Jacobian product, the gradient with respect to x of
  sum(phi(x) * dphi), shape (..., D).

Any object with these two methods can be passed as ``feature_map=``. Maps work on NumPy and
CuPy arrays alike (they only use array methods and ``xp = numpy or cupy``).
"""
import numpy as np

from ._checks import array_module, check_choice, check_count


class EluPlusOne:
    """phi(x) = elu(x) + 1, the paper's map, Eq. (7). F = D.

    elu(x) + 1 is x + 1 for x > 0 and exp(x) for x <= 0: positive, smooth, and its
    gradient is 1 for x > 0 and exp(x) otherwise.
    """

    def forward(self, x):
        xp = array_module(x)
        return xp.where(x > 0, x + 1, xp.exp(xp.minimum(x, 0)))

    def vjp(self, x, dphi):
        xp = array_module(x)
        return dphi * xp.where(x > 0, 1, xp.exp(xp.minimum(x, 0))).astype(x.dtype)

    def __repr__(self):
        return "EluPlusOne()"


class ReLU:
    """phi(x) = max(x, 0). F = D. Non-negative, so a row may get no attention mass at all:
    then the normaliser is eps alone and the output row is 0."""

    def forward(self, x):
        return array_module(x).maximum(x, 0)  # maximum, unlike where, keeps NaN

    def vjp(self, x, dphi):
        xp = array_module(x)
        return dphi * xp.sign(xp.maximum(x, 0))  # step function; NaN stays NaN

    def __repr__(self):
        return "ReLU()"


class Taylor:
    """The degree-2 Taylor map of exp: phi(q) . phi(k) = 1 + q.k + (q.k)^2 / 2.

    phi(x) = [1, x, vec(x x^T) / sqrt(2)], F = 1 + D + D^2. The kernel 1 + s + s^2/2 is
    positive for every s, so the normaliser never vanishes even though phi(x) has negative
    entries. Scale q, k beforehand (e.g. by D^(-1/4)) to approximate softmax's temperature.
    """

    def forward(self, x):
        xp = array_module(x)
        d = x.shape[-1]
        outer = (x[..., :, None] * x[..., None, :]).reshape(*x.shape[:-1], d * d)  # (..., D*D)
        ones = xp.ones((*x.shape[:-1], 1), dtype=x.dtype)
        return xp.concatenate([ones, x, outer / np.sqrt(2)], axis=-1)  # (..., F)

    def vjp(self, x, dphi):
        d = x.shape[-1]
        douter = dphi[..., 1 + d:].reshape(*x.shape, d) / np.sqrt(2)  # (..., D, D)
        # d/dx of sum_ab douter_ab x_a x_b = (douter + douter^T) x
        dquad = (douter + douter.swapaxes(-1, -2)) @ x[..., None]
        return dphi[..., 1:1 + d] + dquad[..., 0]

    def __repr__(self):
        return "Taylor()"


class Favor:
    """Positive orthogonal random features approximating the softmax kernel (FAVOR+,
    Choromanski et al. 2021), the paper's suggestion of Eq. (4) with exp(q.k / sqrt(D)).

    With x' = x / D^(1/4) and random directions w_1..w_F,
    phi(x) = exp(w_f . x' - |x'|^2 / 2) / sqrt(F), so that E[phi(q) . phi(k)] = exp(q.k / sqrt(D)).
    The directions are orthogonal in blocks of D and drawn from ``seed``: the same seed gives the
    same map, for any array module. Error falls like 1/sqrt(F).

    Parameters
    ----------
    n_features : int
        F, the number of random features.
    seed : int
        Seed of the random directions.
    """

    def __init__(self, n_features=64, seed=0):
        self.n_features = check_count("n_features", n_features, 1)
        self.seed = check_count("seed", seed, 0)

    def directions(self, d):
        """The random directions as a float64 NumPy array of shape (D, F)."""
        rng = np.random.default_rng(self.seed)
        blocks = []
        for _ in range(-(-self.n_features // d)):
            gauss = rng.standard_normal((d, d))
            ortho, r = np.linalg.qr(gauss)
            ortho = ortho * np.sign(np.diag(r))       # (D, D), Haar-distributed columns
            norms = np.linalg.norm(rng.standard_normal((d, d)), axis=0)  # chi(D) lengths
            blocks.append(ortho * norms)
        return np.concatenate(blocks, axis=1)[:, : self.n_features]  # (D, F)

    def _project(self, x):
        xp = array_module(x)
        d = x.shape[-1]
        omega = xp.asarray(self.directions(d), dtype=x.dtype)
        xs = x * x.dtype.type(d ** -0.25)
        return xs, omega, xs @ omega  # x', (D, F), (..., F)

    def forward(self, x):
        xp = array_module(x)
        xs, _, h = self._project(x)
        sq = 0.5 * (xs * xs).sum(axis=-1, keepdims=True)
        return xp.exp(h - sq) / x.dtype.type(np.sqrt(self.n_features))

    def vjp(self, x, dphi):
        xs, omega, _ = self._project(x)
        dh = dphi * self.forward(x)  # d phi / d h = phi
        # h - |x'|^2/2 depends on x' through omega and through the norm
        dxs = dh @ omega.T - xs * dh.sum(axis=-1, keepdims=True)
        return dxs * x.dtype.type(x.shape[-1] ** -0.25)

    def __repr__(self):
        return f"Favor(n_features={self.n_features}, seed={self.seed})"


FEATURE_MAPS = {"elu+1": EluPlusOne, "relu": ReLU, "taylor": Taylor, "favor": Favor}


def get_feature_map(feature_map):
    """A feature-map object from a name in FEATURE_MAPS or an object with forward and vjp."""
    if isinstance(feature_map, str):
        return FEATURE_MAPS[check_choice("feature map", feature_map, tuple(FEATURE_MAPS))]()
    if not (callable(getattr(feature_map, "forward", None))
            and callable(getattr(feature_map, "vjp", None))):
        raise TypeError(
            f"feature_map must be one of {', '.join(FEATURE_MAPS)} or an object with "
            f"forward(x) and vjp(x, dphi) methods, got {feature_map!r}"
        )
    return feature_map
