"""``record_function``: a named range of the user's own on the profiled timeline."""
import functools
from typing import Any, Callable, Dict, Optional

from . import events as ev
from .recorder import current


class record_function:
    """Context manager (and decorator) timing its block as a range named ``name``.

    Outside a profiler it does nothing. Ranges nest: ops and modules called inside show
    inside it, on the same track.
    """

    def __init__(self, name: str, args: Optional[Dict[str, Any]] = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"record_function: name must be a non-empty str, got {name!r}")
        self.name, self.args = name, args
        self._rec: Any = None

    def __enter__(self) -> "record_function":
        self._rec = current()
        if self._rec is not None:
            self._rec.open(self.name, ev.USER, dict(self.args or {}))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._rec is not None and self._rec.active:
            self._rec.close_through(self.name, ev.USER)
        self._rec = None

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with record_function(self.name, self.args):
                return fn(*args, **kwargs)
        return wrapped
