"""Channel mixing layers: fixed reversal, random permutation, LU 1x1 "convolution"."""

import torch
from torch import nn


class ReversePermutation(nn.Module):
    """Reverse the order of the features (the official BERT-flow layer); log-det 0."""

    def __init__(self, n_features: int) -> None:
        super().__init__()
        self.n_features = n_features

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        return x.flip(1), 0.0

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y.flip(1)


class RandomPermutation(nn.Module):
    """A fixed permutation drawn once from ``generator``; log-det 0."""

    def __init__(self, n_features: int, generator: torch.Generator | None = None) -> None:
        super().__init__()
        perm = torch.randperm(n_features, generator=generator)
        self.register_buffer("perm", perm)
        self.register_buffer("inv_perm", torch.argsort(perm))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        return x[:, self.perm], 0.0

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y[:, self.inv_perm]


class LUInvertibleLinear(nn.Module):
    r"""Glow's invertible 1x1 convolution, LU-parametrised (a dense layer here).

    :math:`W = P L (U + \mathrm{diag}(\mathrm{sign}(s) e^{\log|s|}))` with ``P``
    a fixed permutation, ``L`` unit lower triangular and ``U`` strictly upper
    triangular; initialised as a random rotation. ``log|det W| = sum(log|s|)``.

    :meth:`start_data_init` arms a data-dependent initialisation, the linear
    counterpart of ActNorm's: the next forward pass sets ``W = R C^{-1/2}``,
    where ``C`` is the covariance of its input and ``R`` the current
    rotation, so the layer starts by whitening the data. Without it, badly
    conditioned data take the optimiser many epochs to undo.
    """

    def __init__(self, n_features: int, generator: torch.Generator | None = None) -> None:
        super().__init__()
        q, _ = torch.linalg.qr(torch.randn(n_features, n_features, generator=generator, dtype=torch.float64))
        p, lower, upper = torch.linalg.lu(q)
        s = torch.diagonal(upper)
        self.register_buffer("p", p.float())
        self.register_buffer("sign_s", torch.sign(s).float())
        self.register_buffer("lower_mask", torch.tril(torch.ones(n_features, n_features), -1))
        self.lower = nn.Parameter(torch.tril(lower, -1).float())
        self.upper = nn.Parameter(torch.triu(upper, 1).float())
        self.log_s = nn.Parameter(torch.log(torch.abs(s)).float())
        self._init_pending = False

    def start_data_init(self) -> None:
        """Whiten the input of the next forward pass (needs more rows than features)."""
        self._init_pending = True

    @torch.no_grad()
    def _data_init(self, x: torch.Tensor) -> None:
        self._init_pending = False
        n_samples, n_features = x.shape
        if n_samples <= n_features:
            return
        centred = (x - x.mean(dim=0)).double()
        eigenvalues, eigenvectors = torch.linalg.eigh(centred.T @ centred / (n_samples - 1))
        eigenvalues = eigenvalues.clamp_min(eigenvalues.max() * 1e-10)
        whitening = (eigenvectors * eigenvalues.rsqrt()) @ eigenvectors.T
        p, lower, upper = torch.linalg.lu(self.weight().double() @ whitening)
        s = torch.diagonal(upper)
        dtype = self.lower.dtype
        self.p.copy_(p.to(dtype))
        self.sign_s.copy_(torch.sign(s).to(dtype))
        self.lower.copy_(torch.tril(lower, -1).to(dtype))
        self.upper.copy_(torch.triu(upper, 1).to(dtype))
        self.log_s.copy_(torch.log(torch.abs(s)).to(dtype))

    def weight(self) -> torch.Tensor:
        eye = torch.eye(self.lower.shape[0], dtype=self.lower.dtype, device=self.lower.device)
        lower = self.lower * self.lower_mask + eye
        upper = self.upper * self.lower_mask.T + torch.diag(self.sign_s * torch.exp(self.log_s))
        return self.p @ lower @ upper

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._init_pending:
            self._data_init(x)
        return x @ self.weight().T, self.log_s.sum()

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return torch.linalg.solve(self.weight(), y.T).T
