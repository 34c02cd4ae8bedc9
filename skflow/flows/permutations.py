"""Channel mixing layers: fixed reversal, random permutation, LU-parametrised invertible linear map."""

import torch
from torch import nn

from skflow.flows.base import FlowLayer


class ReversePermutation(FlowLayer):
    """Reverse the order of the features (the official BERT-flow layer); log-det 0."""

    def __init__(self, n_features: int) -> None:
        super().__init__()
        self.n_features = n_features

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.flip(1), x.new_zeros(())

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y.flip(1)


class RandomPermutation(FlowLayer):
    """A fixed permutation drawn once from ``generator``; log-det 0."""

    def __init__(self, n_features: int, generator: torch.Generator | None = None) -> None:
        super().__init__()
        perm = torch.randperm(n_features, generator=generator)
        self.register_buffer("perm", perm)
        self.register_buffer("inv_perm", torch.argsort(perm))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[:, self.perm], x.new_zeros(())

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y[:, self.inv_perm]


class LUInvertibleLinear(FlowLayer):
    r"""Glow's invertible 1x1 convolution, LU-parametrised (a dense layer here).

    :math:`W = P L (U + \mathrm{diag}(\mathrm{sign}(s) e^{\log|s|}))` with ``P``
    a fixed permutation, ``L`` unit lower triangular and ``U`` strictly upper
    triangular; initialised as a random rotation. ``log|det W| = sum(log|s|)``.
    A batch with fewer rows than features (training) gets the factors one
    after the other (two triangular products and a column gather), which
    costs less than forming ``W``; a larger batch (inference) gets ``W``.

    :meth:`data_init` sets ``W = R C^{-1/2}``, where ``C`` is the covariance
    of its input and ``R`` the current rotation, so the layer starts by
    whitening the data. Without it, badly conditioned data take the optimiser
    many epochs to undo. Directions without variance (below 1e-10 of the
    largest: rank-deficient data) are scaled like the largest, not blown up.

    The entries of ``L`` and ``U`` learn at ``1 / n_features`` of the
    learning rate (:meth:`step_scales`). Adam moves every entry by about the
    learning rate whatever its gradient, so one step at the full rate moves
    all ``n_features**2`` entries at once and changes ``W`` by up to
    ``n_features`` times the rate; on 384-d sentence embeddings that made
    the loss explode within the first 20 steps (to 1e9 nats per row). Scaled,
    a step changes ``W`` by about the rate, like any other parameter.
    """

    def __init__(self, n_features: int, generator: torch.Generator | None = None) -> None:
        super().__init__()
        q, _ = torch.linalg.qr(torch.randn(n_features, n_features, generator=generator, dtype=torch.float64))
        self.register_buffer("perm", torch.zeros(n_features, dtype=torch.long))
        self.register_buffer("sign_s", torch.zeros(n_features))
        self.register_buffer("lower_mask", torch.tril(torch.ones(n_features, n_features), -1))
        self.lower = nn.Parameter(torch.zeros(n_features, n_features))
        self.upper = nn.Parameter(torch.zeros(n_features, n_features))
        self.log_s = nn.Parameter(torch.zeros(n_features))
        self._set_weight(q)

    @torch.no_grad()
    def _set_weight(self, weight: torch.Tensor) -> None:
        p, lower, upper = torch.linalg.lu(weight)
        s = torch.diagonal(upper)
        dtype = self.lower.dtype
        self.perm.copy_(p.argmax(dim=1))  # W = P L U: row j of W comes from row perm[j] of L U
        self.sign_s.copy_(torch.sign(s).to(dtype))
        self.lower.copy_(torch.tril(lower, -1).to(dtype))
        self.upper.copy_(torch.triu(upper, 1).to(dtype))
        self.log_s.copy_(torch.log(torch.abs(s)).to(dtype))

    @torch.no_grad()
    def data_init(self, x: torch.Tensor) -> torch.Tensor:
        """Whiten ``x`` (needs more rows than features; otherwise nothing changes)."""
        n_samples, n_features = x.shape
        if n_samples > n_features:
            centred = (x - x.mean(dim=0)).double()
            eigenvalues, eigenvectors = torch.linalg.eigh(centred.T @ centred / (n_samples - 1))
            largest = eigenvalues.max()
            # a direction without variance (rank-deficient data) is left at the largest one's scale: whitened
            # like the others, its gain of 1e5 per LU layer compounds, and one step then blows the loss up
            eigenvalues = torch.where(eigenvalues > largest * 1e-10, eigenvalues, largest)
            whitening = (eigenvectors * eigenvalues.rsqrt()) @ eigenvectors.T
            self._set_weight(self.weight().double() @ whitening)
        return self(x)[0]

    def step_scales(self) -> dict[str, float]:
        return {"lower": 1.0 / self.lower.shape[0], "upper": 1.0 / self.lower.shape[0]}

    def _factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        eye = torch.eye(self.lower.shape[0], dtype=self.lower.dtype, device=self.lower.device)
        lower = self.lower * self.lower_mask + eye
        upper = self.upper * self.lower_mask.T + torch.diag(self.sign_s * torch.exp(self.log_s))
        return lower, upper

    def weight(self) -> torch.Tensor:
        """The matrix ``W``."""
        lower, upper = self._factors()
        return (lower @ upper)[self.perm]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lower, upper = self._factors()
        if torch.compiler.is_exporting() or x.shape[0] > x.shape[1]:  # exported graphs take any batch: W
            return x @ (lower @ upper)[self.perm].T, self.log_s.sum()
        return (x @ upper.T @ lower.T)[:, self.perm], self.log_s.sum()

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        lower, upper = self._factors()
        h = torch.empty_like(y)
        h[:, self.perm] = y
        h = torch.linalg.solve_triangular(lower, h.T, upper=False, unitriangular=True)
        return torch.linalg.solve_triangular(upper, h, upper=True).T
