"""Progress bars over batches, shared by the estimators."""

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def progress_bar(desc: str, total: int, *, enabled: bool) -> Iterator[Callable[..., None]]:
    """A tqdm bar on stderr when ``enabled``; yields ``update(n=1, **postfix)``, a no-op otherwise."""
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=desc, unit="batch", disable=not enabled) as bar:

        def update(n: int = 1, **postfix) -> None:
            bar.update(n)
            if postfix:
                bar.set_postfix(postfix)

        yield update
