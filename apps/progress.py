"""A tqdm progress bar for training loops: running loss and samples per second."""
import importlib.util
import time
from typing import Any, Iterable, Optional

# In Jupyter, tqdm.auto draws an ipywidgets bar and, where ipywidgets is not installed, warns
# ("IProgress not found") in every cell that trains; plain tqdm then hides the bar instead
# (the kernel's stderr is not a terminal).
if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm import tqdm


class Progress:
    """Wrap an iterable of batches; ``update(loss, n)`` after each step refreshes the postfix.

    ``disable=None`` (the default) hides the bar when stderr is not a terminal, as tqdm does.
    """

    def __init__(self, iterable: Iterable, total: Optional[int] = None, desc: str = "",
                 disable: Optional[bool] = None):
        self.bar = tqdm(iterable, total=total, desc=desc, disable=disable, leave=False,
                        dynamic_ncols=True, unit="batch")
        self.start = time.perf_counter()
        self.samples = 0

    def __iter__(self) -> Any:
        return iter(self.bar)

    def update(self, loss: float, n: int) -> None:
        """Record a step over ``n`` samples with mean loss ``loss``."""
        self.samples += n
        rate = self.samples / max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{rate:,.0f}", refresh=False)

    def close(self) -> None:
        """Remove the bar."""
        self.bar.close()
