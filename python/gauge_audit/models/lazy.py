"""Parameters read on access: a ``Mapping[str, Tensor]`` that loads each tensor when it
is looked up and keeps nothing (unless a subclass caches).

The family forwards touch block ``i``'s tensors only while they run block ``i``, so a
forward over a :class:`LazyParams` holds one block at a time: checking a checkpoint
whose float64 copy does not fit in memory needs memory for the embeddings, one block
and the activations — independent of the depth.  ``cast`` gives a view in another
dtype / device (applied on access), so ``numeric.check`` can evaluate a lazy model in
float32 or bfloat16 without materialising a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch

Shapes = dict[str, tuple]
# A parameter point: a plain dict or a LazyParams (both are read-only mappings to the checkers).
Params = Mapping[str, torch.Tensor]


class LazyParams(Mapping[str, torch.Tensor]):
    """Named tensors in the project's layout (float64 on the CPU unless cast),
    produced by ``load(name)`` on every access."""

    def __init__(
        self,
        shapes: Shapes,
        load: Callable[[str], torch.Tensor],
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
        stable: bool = False,
    ):
        self.shapes = dict(shapes)
        self._load = load
        self.dtype = dtype
        self.device = torch.device(device)
        # every access returns the same tensor object (a resident checkpoint), so a result
        # computed from these tensors may be kept while they are unchanged
        self.stable = stable

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.shapes:
            raise KeyError(name)
        t = self._load(name)
        return t if (t.dtype, t.device) == (self.dtype, self.device) else t.to(self.device, self.dtype)

    def __contains__(self, name) -> bool:
        return name in self.shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def cast(self, dtype: torch.dtype | None = None, device=None) -> LazyParams:
        """The same tensors, converted to ``dtype`` / ``device`` on access."""
        same = (dtype or self.dtype, torch.device(device or self.device)) == (self.dtype, self.device)
        return LazyParams(
            self.shapes, self.__getitem__, dtype or self.dtype, device or self.device, stable=self.stable and same
        )

    def extended(self, extra: dict[str, tuple[tuple, Callable[[LazyParams], torch.Tensor]]]) -> LazyParams:
        """These tensors plus ``extra``: name → (shape, fn(params) -> tensor), computed on access."""

        def load(name: str) -> torch.Tensor:
            return extra[name][1](self) if name in extra else self[name]

        return LazyParams({**self.shapes, **{k: s for k, (s, _) in extra.items()}}, load, self.dtype, self.device)

    def numel(self) -> int:
        total = 0
        for shape in self.shapes.values():
            n = 1
            for s in shape:
                n *= int(s)
            total += n
        return total


def params_dtype(params: Mapping) -> torch.dtype:
    """The dtype of a parameter set, without loading a lazy one."""
    return params.dtype if isinstance(params, LazyParams) else next(iter(params.values())).dtype


def params_device(params: Mapping) -> torch.device:
    return params.device if isinstance(params, LazyParams) else next(iter(params.values())).device
