"""The multi-scale Glow of BERT-flow, for vectors (no squeeze: every 1x1 conv is dense)."""

import math

import torch
from torch import nn

from skflow.flows.actnorm import ActNorm
from skflow.flows.couplings import AdditiveCoupling, AffineCoupling
from skflow.flows.permutations import LUInvertibleLinear, RandomPermutation, ReversePermutation

COUPLINGS = {"additive": AdditiveCoupling, "affine": AffineCoupling}
PERMUTATIONS = ("reverse", "random", "lu")
LOG_2PI = math.log(2.0 * math.pi)


def level_sizes(n_features: int, n_levels: int) -> list[int]:
    """Active features at each level of the multi-scale flow.

    After every level but the last, ``floor(c / 2)`` features are factored out
    and ``ceil(c / 2)`` continue. A level needs at least two features for its
    couplings, so a small ``n_features`` gets fewer levels than asked for; a
    single feature gets one level of ActNorm steps only (an affine map).
    """
    sizes = [n_features]
    while len(sizes) < n_levels and (sizes[-1] + 1) // 2 >= 2:
        sizes.append((sizes[-1] + 1) // 2)
    return sizes


def _make_permutation(kind: str, n_features: int, generator: torch.Generator | None) -> nn.Module:
    if kind == "reverse":
        return ReversePermutation(n_features)
    if kind == "random":
        return RandomPermutation(n_features, generator)
    if kind == "lu":
        return LUInvertibleLinear(n_features, generator)
    raise ValueError(f"permutation must be one of {PERMUTATIONS}, got {kind!r}")


class FlowStep(nn.Module):
    """One Glow step: ActNorm, then the permutation, then the coupling.

    With a single feature there is nothing to permute or couple: the step is
    ActNorm alone, and ``permutation`` and ``coupling`` are None.
    """

    def __init__(
        self,
        n_features: int,
        *,
        hidden_channels: int,
        coupling: str,
        permutation: str,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if coupling not in COUPLINGS:
            raise ValueError(f"coupling must be one of {tuple(COUPLINGS)}, got {coupling!r}")
        self.actnorm = ActNorm(n_features)
        self.permutation = self.coupling = None
        if n_features >= 2:
            self.permutation = _make_permutation(permutation, n_features, generator)
            self.coupling = COUPLINGS[coupling](n_features, hidden_channels, generator)

    def layers(self) -> list[nn.Module]:
        return [layer for layer in (self.actnorm, self.permutation, self.coupling) if layer is not None]

    @torch.no_grad()
    def data_init(self, x: torch.Tensor) -> torch.Tensor:
        """Initialise every layer from the data that reaches it; returns the step's output."""
        for layer in self.layers():
            x = layer.data_init(x)
        return x

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logdet = 0.0
        for layer in self.layers():
            x, layer_logdet = layer(x)
            logdet = logdet + layer_logdet
        return x, logdet

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        for layer in reversed(self.layers()):
            y = layer.inverse(y)
        return y


class Glow(nn.Module):
    """Multi-scale Glow on ``(n, n_features)`` vectors with a standard normal prior.

    ``n_levels`` levels of ``depth`` steps; after every level but the last,
    the second half of the active features is factored out and scored under
    N(0, I). The latent keeps the input layout: the features that stay active
    come first, so ``z[:, :c]`` is the top level and the factored-out blocks
    follow in reverse order of their level.

    Parameters
    ----------
    n_features : int
        Dimension of the data, at least 1.
    n_levels, depth, hidden_channels : int
        Levels, steps per level and width of the coupling networks.
    coupling : {"additive", "affine"}
    permutation : {"reverse", "random", "lu"}
    generator : torch.Generator, optional
        Source of the random initialisation.

    Examples
    --------
    >>> import torch
    >>> flow = Glow(6, n_levels=2, depth=2).double()
    >>> x = torch.randn(4, 6, dtype=torch.float64)
    >>> z, logdet = flow(x)
    >>> torch.allclose(flow.inverse(z), x)
    True
    >>> flow.log_prob(x).shape
    torch.Size([4])
    """

    def __init__(
        self,
        n_features: int,
        *,
        n_levels: int = 3,
        depth: int = 3,
        hidden_channels: int = 32,
        coupling: str = "additive",
        permutation: str = "reverse",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if n_features < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        self.n_features = n_features
        self.sizes = level_sizes(n_features, n_levels)
        self.levels = nn.ModuleList(
            nn.ModuleList(
                FlowStep(
                    size,
                    hidden_channels=hidden_channels,
                    coupling=coupling,
                    permutation=permutation,
                    generator=generator,
                )
                for _ in range(depth)
            )
            for size in self.sizes
        )

    def _run(self, x: torch.Tensor, step_fn) -> tuple[torch.Tensor, list]:
        """Apply ``step_fn`` to every step, factoring out after every level but the last."""
        outputs, factored, h = [], [], x
        for index, steps in enumerate(self.levels):
            for step in steps:
                h, extra = step_fn(step, h)
                outputs.append(extra)
            if index + 1 < len(self.sizes):
                keep = self.sizes[index + 1]
                factored.append(h[:, keep:])
                h = h[:, :keep]
        z = torch.cat([h, *reversed(factored)], dim=1) if factored else h
        return z, outputs

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Map data to the latent; returns ``z`` and ``log|det dz/dx|`` per row."""
        z, logdets = self._run(x, lambda step, h: step(h))
        logdet = sum(logdets, x.new_zeros(()))
        return z, logdet.expand(x.shape[0]) if logdet.dim() == 0 else logdet

    def inverse(self, z: torch.Tensor) -> torch.Tensor:
        """Exact inverse of :meth:`forward`."""
        h = z[:, : self.sizes[-1]]
        for index in range(len(self.sizes) - 1, -1, -1):
            if index + 1 < len(self.sizes):
                h = torch.cat([h, z[:, self.sizes[index + 1] : self.sizes[index]]], dim=1)
            for step in reversed(self.levels[index]):
                h = step.inverse(h)
        return h

    def latent_and_log_prob(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The latent ``z`` of each row and its log-density in nats.

        The one place where the latent and the log-determinant become a
        log-likelihood: ``log N(z; 0, I) + log|det dz/dx|``.
        """
        z, logdet = self(x)
        return z, -0.5 * (z.square().sum(dim=1) + z.shape[1] * LOG_2PI) + logdet

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Log-density of each row of ``x`` in nats."""
        return self.latent_and_log_prob(x)[1]

    @torch.no_grad()
    def data_init(self, x: torch.Tensor) -> None:
        """Data-dependent initialisation of every layer, in one pass over a batch ``x``."""
        self._run(x, lambda step, h: (step.data_init(h), None))
