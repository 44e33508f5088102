"""The two calls for a loop the hooks cannot see; both do nothing outside a profiled run.

    import probe

    for batch in batches:            # not a DataLoader, and no torch.optim optimizer
        with probe.step():           # one step: its exit ends it
            loss = train_on(batch)
            probe.record(loss=loss)  # a tensor is read from the device later, never now

Once ``probe.step()`` is used, it alone delimits steps (the optimizer and DataLoader
hooks still record data wait, the loss and the gradient norm inside the block).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from probe.session import active


@contextlib.contextmanager
def step() -> Iterator[None]:
    """One training step, from entering the block to leaving it."""
    session = active()
    if session is None:
        yield
        return
    session.explicit_begin()
    yield
    session.explicit_end()


def record(**values: Any) -> None:
    """This step's ``loss``, ``grad_norm`` or ``batch_size`` (floats or tensors)."""
    session = active()
    if session is not None:
        session.record(**values)
