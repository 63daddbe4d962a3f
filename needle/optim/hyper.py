"""Optimizer hyperparameters checked where they are set: at construction, by a learning-rate
schedule, by ``load_state_dict``. A nan or inf learning rate trains to NaN and exits 0; a
negative one climbs the loss; a beta of 1 divides by zero in Adam's bias correction. Each
rule is declared once, beside the optimizer's other class attributes (``lr = Hyper(lo=0)``)."""
import numbers as abc
from typing import TYPE_CHECKING, Any, Optional

from .. import numbers


class Hyper:
    """A checked hyperparameter: a finite real in a range (``count``: a whole number;
    ``flag``: a bool), or None where ``optional``. Reads are plain instance attributes (the
    descriptor has no ``__get__``), so a step pays nothing for the check."""

    def __init__(self, lo: Optional[float] = None, hi: Optional[float] = None,
                 lo_open: bool = False, hi_open: bool = False, optional: bool = False,
                 count: bool = False, flag: bool = False) -> None:
        self.lo, self.hi, self.lo_open, self.hi_open = lo, hi, lo_open, hi_open
        self.optional, self.count, self.flag = optional, count, flag
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = self.check(f"{type(obj).__name__}: {self.name}", value)

    if TYPE_CHECKING:  # for mypy only: at run time reads find the instance's value directly
        def __get__(self, obj: Any, owner: Any = None) -> Any: ...

    def check(self, name: str, value: Any) -> Any:
        """``value`` if it follows this rule (a NumPy scalar as a Python number), else a
        ``ValueError`` naming ``name``, the value and the rule."""
        if value is None and self.optional:
            return None
        if self.flag:
            if isinstance(value, bool):
                return value
            raise numbers.NumberError(f"{name} {value!r} must be True or False")
        if not isinstance(value, abc.Real) or isinstance(value, bool):  # '0.1', [0.1], a Tensor
            rule = ("a whole number" if self.count else "a finite number") + \
                (" or None" if self.optional else "")
            raise numbers.NumberError(f"{name} {value!r} must be {rule}, not "
                                      f"{type(value).__name__}")
        if self.count:
            return numbers.count(value, name, lo=self.lo, hi=self.hi)  # type: ignore[arg-type]
        return numbers.real(value, name, self.lo, self.hi, self.lo_open, self.hi_open)
