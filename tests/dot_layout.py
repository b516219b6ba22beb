"""Reading the DOT text of ``capturelint show``/``diff`` back, and where dot draws it.

``nodes(dot)`` lists the nodes in id order (execution order) with their enclosing
clusters; ``scope`` restores a node's full module scope from its row
(``model.layers.1`` + ``attn.wq_b``); ``piece`` names the segment piece holding it as
``captured #2`` or ``eager break <qualified name>``; ``positions(dot)`` runs
``dot -Tplain`` for the drawn centre of each node (inches, y up).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess

_LABEL = re.compile(r'label="((?:[^"\\]|\\.)*)"')


@dataclasses.dataclass(frozen=True)
class DotNode:
    id: int
    lines: tuple[str, ...]  # the label's lines
    clusters: tuple[tuple[str, str], ...]  # (name, first label line ... whole label), outermost first

    @property
    def piece_cluster(self) -> str:
        return next((name for name, _ in reversed(self.clusters) if re.search(r"_p\d+$", name)), "")

    @property
    def line(self) -> str:
        """The band (one layer, or a row outside layers) the node is drawn in."""
        return re.sub(r"_p\d+$", "", self.piece_cluster)

    @property
    def piece_label(self) -> str:
        return dict(self.clusters).get(self.piece_cluster, "")

    @property
    def piece(self) -> str:
        """``captured #2``, ``captured`` (a folded row) or ``eager break <name>``."""
        first, *rest = self.piece_label.split("\\n")
        head = re.split(r" · |, continued| \(×", first)[0]
        return f"eager break {rest[-1]}" if head.startswith("eager break") else head

    @property
    def segment(self) -> int | None:
        """The segment index its piece names (``None`` in a folded row)."""
        m = re.match(r"(?:captured|eager break) #(\d+)", self.piece_label)
        return int(m.group(1)) if m else None

    @property
    def row(self) -> str:
        """The label of the layer row holding the node (``model.layers.0-3 (×4)``), or ``""``."""
        return next((lab for name, lab in reversed(self.clusters) if re.search(r"_r\d+$", name)), "")

    @property
    def scope(self) -> str:
        """The node's module scope: its row's layer and the name drawn below it."""
        name = self.lines[0].split(" · ")[0]
        layer = self.row.split(" ")[0]
        if not layer or not re.search(r"\.\d+$", layer):
            return name
        return layer if name == "<layer>" else f"{layer}.{name}"

    @property
    def label(self) -> str:
        return "\n".join(self.lines)


def nodes(dot: str) -> list[DotNode]:
    stack: list[list[str]] = []  # [name, label]
    out = []
    for line in dot.splitlines():
        s = line.strip()
        m = re.match(r"subgraph (cluster_\w+) \{", s)
        if m:
            stack.append([m.group(1), ""])
        elif s == "{" or s.startswith("{rank") or s.startswith("digraph "):
            if not s.endswith("}"):
                stack.append(["", ""])
        elif s == "}":
            stack.pop()
        elif re.match(r"n\d+ \[", s):
            out.append(DotNode(int(s[1:s.index(" ")]), tuple(_LABEL.search(s).group(1).split("\\n")),
                               tuple((n, lab) for n, lab in stack if n)))
        elif stack and stack[-1][0] and not stack[-1][1] and s.startswith(("color=", "label=", "fontcolor=")):
            found = _LABEL.search(s)
            stack[-1][1] = found.group(1) if found else ""
    return sorted(out, key=lambda n: n.id)


def positions(dot: str) -> dict[int, tuple[float, float]]:
    """Each node's drawn centre, from ``dot -Tplain`` (inches; y grows upwards)."""
    plain = subprocess.run(["dot", "-Tplain"], input=dot, capture_output=True, text=True, check=True, timeout=60).stdout
    return {int(p[1][1:]): (float(p[2]), float(p[3])) for p in (line.split() for line in plain.splitlines())
            if p[0] == "node" and re.fullmatch(r"n\d+", p[1])}  # not the invisible spacers s1, s2, ...


def size_px(dot: str) -> tuple[int, int]:
    """The drawn size in pixels at 96 dpi (what ``dot -Tpng`` writes), from the SVG's points."""
    svg = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True, timeout=60).stdout
    w, h = (float(re.search(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg).group(i)) for i in (1, 2))
    return round(w * 96 / 72), round(h * 96 / 72)
