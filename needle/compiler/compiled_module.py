"""``needle.compile(module)``: like ``torch.compile``'s ``OptimizedModule``, calls are compiled
(guarded by every submodule's ``training`` flag) and everything else is the module's own."""
from typing import Any, Callable


class CompiledModule:
    """``module`` with compiled calls; attribute access goes to the module."""

    def __init__(self, module: Any, make: Callable[..., Any]) -> None:
        self._orig_mod = module
        self.compiled = make(module, guard=self._modes)

    def _modes(self) -> tuple:
        return tuple(m.training for _, m in self._orig_mod.named_modules())

    def __call__(self, *args: Any) -> Any:
        return self.compiled(*args)

    def train(self, mode: bool = True) -> "CompiledModule":
        """Set training mode on the module (a new mode traces its own program)."""
        self._orig_mod.train(mode)
        return self

    def eval(self) -> "CompiledModule":
        """Set evaluation mode on the module."""
        return self.train(False)

    def __getattr__(self, name: str) -> Any:
        if name in ("_orig_mod", "compiled"):  # not yet set (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self._orig_mod, name)

    def __repr__(self) -> str:
        return f"CompiledModule({self._orig_mod!r})"
