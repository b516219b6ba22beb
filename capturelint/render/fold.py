"""What a region diagram draws, row by row: layers in execution order, repeats folded.

A capture is a sequence of segments (captured, eager break) and each segment a sequence
of items (a module scope, or a run of one op, with its op count). Segments straddle
layers: a captured segment holds the end of layer *i* and the start of layer *i + 1*. A
diagram reads best cut the other way, so ``rows`` cuts the sequence at layer boundaries:

- an item's **layer** is its scope up to the first numbered module
  (``model.layers.3.attn.wq_a`` is in ``model.layers.3``, shown as ``attn.wq_a``);
  items outside any layer (``model.embed``, ``model.norm``, a plain program's scopes)
  form rows of their own;
- a **layer** is a maximal run of consecutive items with the same layer, cut into
  **pieces**, one per segment it touches, in execution order;
- consecutive layers with the same **signature** (pieces: segment kind, break name,
  where segments start; items: scope below the layer, op counts, marks) are
  **folded** into one ``Row``: ``model.layers.0-3 (×4)``, or a
  pattern of ``period`` layers repeated (``model.layers.0-59 (layers 0-3 ×15)``), drawn
  once. A layer that differs (a finding only it has, ops a diff moved in it) breaks the
  run and is drawn on its own.

Pure functions over plain values: no Graphviz, no region graph. ``capturelint.render.dot``
draws the rows; ``capturelint.render.tree`` folds the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Hashable, Sequence

MAX_PERIOD = 8  # longest pattern of layers looked for (DeepSeek V4 cycles four attention kinds)
OTHER_PIECES = 4  # pieces per row outside layers, so a long plain program wraps instead of widening


@dataclasses.dataclass(frozen=True)
class Item:
    """One node: a module scope (or a run of one op) in one segment.

    ``detail`` is what must be equal for two layers to fold (op counts by op, or the op
    and its source line); ``marks`` are the finding tags or diff notes drawn on it;
    ``key`` is the renderer's handle (what data flow refers to).
    """

    key: Hashable
    scope: str
    ops: int
    detail: tuple = ()
    marks: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Segment:
    """A segment in execution order: ``kind`` is ``"captured"`` or ``"eager"``."""

    index: int
    kind: str
    label: str
    ops: int
    items: tuple[Item, ...]
    marks: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Piece:
    """The items of one segment that fall in one layer; ``starts``: the segment begins here."""

    segment: Segment
    starts: bool
    items: tuple[Item, ...]


@dataclasses.dataclass(frozen=True)
class Layer:
    """Consecutive items of one layer (``prefix`` ``model.layers.3``, ``number`` 3), or
    of no layer (``prefix`` ``None``)."""

    prefix: str | None
    number: int | None
    pieces: tuple[Piece, ...]


@dataclasses.dataclass(frozen=True)
class Row:
    """Layers drawn as one: ``layers[:period]`` stand for all of ``layers``, a pattern
    repeated ``repeats`` times (``period`` 1: identical layers)."""

    layers: tuple[Layer, ...]
    period: int = 1

    @property
    def repeats(self) -> int:
        return len(self.layers) // self.period

    @property
    def folded(self) -> bool:
        return len(self.layers) > 1

    @property
    def shown(self) -> tuple[Layer, ...]:
        return self.layers[:self.period]

    @property
    def label(self) -> str:
        """``model.layers.3``, ``model.layers.0-3 (×4)``, ``model.layers.0-59 (layers 0-3 ×15)``."""
        first, last = self.layers[0], self.layers[-1]
        if first.prefix is None:
            return ""
        if not self.folded:
            return first.prefix
        span = f"{first.prefix}-{last.number}"
        if self.period == 1:
            return f"{span} (×{self.repeats})"
        return f"{span} (layers {first.number}-{self.shown[-1].number} ×{self.repeats})"

    def member_label(self, k: int) -> str:
        """The label of shown layer ``k`` of a pattern: ``model.layers.1, 5, …, 57 (×15)``,
        ``model.layers.1, 5 (×2)``."""
        layer = self.shown[k]
        if self.period == 1 or not self.folded:
            return layer.prefix or ""
        numbers = [m.number for m in self.layers[k::self.period]]
        rest = numbers[1:] if len(numbers) <= 3 else [numbers[1], "…", numbers[-1]]
        return f"{layer.prefix}, {', '.join(map(str, rest))} (×{len(numbers)})"


def split_layer(scope: str) -> tuple[str | None, int | None, str]:
    """``model.layers.3.attn.wq_a`` -> ``("model.layers.3", 3, "attn.wq_a")``; a scope in
    no numbered module -> ``(None, None, scope)``."""
    parts = scope.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[:i + 1]), int(p), ".".join(parts[i + 1:])
    return None, None, scope


def layers_of(segments: Sequence[Segment]) -> list[Layer]:
    """The items of every segment, in execution order, cut into layers and pieces."""
    runs: list[tuple[str | None, int | None, list[Piece]]] = []
    for seg in segments:
        items = seg.items or ()
        if not items:  # a segment without ops still shows, in the layer it sits in
            if runs:
                runs[-1][2].append(Piece(seg, True, ()))
            else:
                runs.append((None, None, [Piece(seg, True, ())]))
            continue
        starts = True
        for item in items:
            prefix, number, _ = split_layer(item.scope)
            if not runs or runs[-1][0] != prefix:
                runs.append((prefix, number, []))
            pieces = runs[-1][2]
            if pieces and pieces[-1].segment.index == seg.index:
                pieces[-1] = dataclasses.replace(pieces[-1], items=pieces[-1].items + (item,))
            else:
                pieces.append(Piece(seg, starts, (item,)))
            starts = False
    out: list[Layer] = []
    for prefix, number, pieces in runs:
        if prefix is None:  # rows outside layers wrap after OTHER_PIECES pieces
            for start in range(0, len(pieces), OTHER_PIECES):
                out.append(Layer(None, None, tuple(pieces[start:start + OTHER_PIECES])))
        else:
            out.append(Layer(prefix, number, tuple(pieces)))
    return out


def signature(layer: Layer) -> Hashable:
    """What two layers must share to fold: per piece the segment kind, the break's name
    and whether the segment starts there (with its marks), and per item the scope below
    the layer, op count, detail and marks. Rows outside layers never fold."""
    if layer.prefix is None:
        return id(layer)
    return tuple(
        (p.segment.kind, p.segment.label if p.segment.kind == "eager" else "", p.starts, p.starts and p.segment.marks,
         tuple((split_layer(i.scope)[2], i.ops, i.detail, i.marks) for i in p.items))
        for p in layer.pieces
    )


def fold_runs(signatures: Sequence[Hashable], max_period: int = MAX_PERIOD) -> list[tuple[int, int, int]]:
    """``(start, period, repeats)`` covering ``signatures`` in order: at each start the
    pattern of at most ``max_period`` signatures repeated back to back over the most
    elements (the shortest pattern on a tie); ``(start, 1, 1)`` where nothing repeats."""
    out = []
    i, n = 0, len(signatures)
    while i < n:
        best_p, best_r = 1, 1
        for p in range(1, max_period + 1):
            if i + 2 * p > n:
                break
            r = 1
            while i + (r + 1) * p <= n and signatures[i + r * p:i + (r + 1) * p] == signatures[i:i + p]:
                r += 1
            if r >= 2 and p * r > best_p * best_r:
                best_p, best_r = p, r
        out.append((i, best_p, best_r))
        i += best_p * best_r
    return out


def rows(segments: Sequence[Segment], fold: bool = True) -> list[Row]:
    """The rows of a diagram: ``segments`` cut into layers (``layers_of``), consecutive
    repeats folded (``fold_runs`` over the layers' signatures) unless ``fold`` is false."""
    layers = layers_of(segments)
    if not fold:
        return [Row((layer,)) for layer in layers]
    return [Row(tuple(layers[i:i + p * r]), p) for i, p, r in fold_runs([signature(layer) for layer in layers])]


def item_rows(rows_: Sequence[Row]) -> dict[Hashable, tuple[int, int, int, int]]:
    """Where each item is drawn: key -> ``(row, shown layer, piece, item)``; the items
    of a folded layer map to the shown layer they repeat."""
    out: dict[Hashable, tuple[int, int, int, int]] = {}
    for ri, row in enumerate(rows_):
        for li, layer in enumerate(row.layers):
            for pi, piece in enumerate(layer.pieces):
                for ii, item in enumerate(piece.items):
                    out[item.key] = (ri, li % row.period, pi, ii)
    return out


__all__ = ["Item", "Layer", "Piece", "Row", "Segment", "fold_runs", "item_rows", "layers_of", "rows", "signature", "split_layer"]
