"""Verify batch shapes a GPU can reuse.

llama.cpp's CUDA backend replays a captured graph only while decodes keep one shape (tokens
and output rows): it keeps one graph per context, and after any change of shape it runs the
next decode without a graph and captures again on the one after. A step whose batch size
differs from the last step's so pays for graph-less launches twice and a capture. On a GPU a
verify row costs little (an 8B F16 model on an H200: 8 rows 1.40x one token, 16 rows 1.52x),
so a step can pad its batch with rows nobody reads and keep the shape instead.

`BatchShapes` decides each step's batch: from a few sizes only, and the last step's size again
until the rows padded since it was chosen have cost as much as a change. Padding rows ask for
logits like the others (the output rows are part of the shape), come after every real row,
are never read, and are rewound with the rejected ones. On a CPU a row costs nearly a step
and there is no graph to keep: `BatchShapes.any()` decodes exactly the rows a step needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from specli.decode.costs import VerifyCurve

# Rows a verify batch may have on a GPU: [last] plus 1, 2, 4, 8, 16, 32 or 48 draft tokens.
GPU_SIZES = (1, 2, 3, 5, 9, 17, 33, 49)


@dataclass
class BatchShapes:
    """The batch sizes a target's verify decodes use, and the one its last decode used.

    Keeping a shape is a rent-or-buy choice: padding is paid every step, a change once. The
    last shape is kept while the padding it has cost since it was chosen stays within the
    price of a change; then the batch changes to the smallest size that holds the rows."""

    sizes: tuple[int, ...] = ()  # allowed sizes, ascending; empty: any size (no padding)
    change: float = 0.0  # seconds a change of shape costs (graph-less launches, a capture)
    curve: VerifyCurve | None = None  # what padding rows cost (None: nothing)
    last: int = 0  # rows of the last verify decode (0: none yet)
    changed: bool = False  # whether that decode's shape differed from the one before
    padded: float = 0.0  # what padding to `last` has cost since it was last chosen

    @classmethod
    def any(cls) -> BatchShapes:
        return cls()

    def priced(self, curve: VerifyCurve, change: float) -> None:
        """Keep to GPU_SIZES, with padding priced on `curve` and a change at `change` seconds."""
        self.sizes, self.curve, self.change = GPU_SIZES, curve, change

    def rows(self, needed: int, most: int | None = None) -> int:
        """The batch to decode for `needed` rows: the last shape again where it holds them and
        its padding stays within the price of a change, else the smallest allowed size that
        holds them; never more than `most` (an --exact cap, the context's room), where no
        allowed size fits, exactly `needed`."""
        if not self.sizes:
            return needed
        fitting = [size for size in self.sizes if needed <= size <= (most or needed)]
        if not fitting:
            return needed
        smallest = fitting[0]
        if self.last in fitting and self.last != smallest and self.padded + self._padding(smallest) <= self.change:
            return self.last
        return smallest

    def cost(self, curve: VerifyCurve, needed: int, most: int | None = None) -> float:
        """A verify of `needed` rows as it will be decoded, priced on `curve`: the padded
        batch, and a change of shape where it is one."""
        rows = self.rows(needed, most)
        changed = bool(self.sizes) and self.last > 0 and rows != self.last
        return curve.cost(rows) + (self.change if changed else 0.0)

    def used(self, rows: int, needed: int) -> None:
        """The verify decode just made had `rows` rows, of which `needed` were wanted."""
        self.changed = bool(self.sizes) and self.last > 0 and rows != self.last
        fitting = [size for size in self.sizes if needed <= size]
        smallest = fitting[0] if fitting else rows
        self.padded = 0.0 if self.changed or rows <= smallest else self.padded + self._padding(smallest)
        self.last = rows

    def paid(self, curve: VerifyCurve, rows: int) -> float:
        """What the verify decode just made (`rows` rows, after `used`) cost, priced on `curve`."""
        return curve.cost(rows) + (self.change if self.changed else 0.0)

    def _padding(self, rows: int) -> float:
        """What decoding `last` rows costs over `rows`."""
        return self.curve.cost(self.last) - self.curve.cost(rows) if self.curve is not None else 0.0
