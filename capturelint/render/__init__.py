"""Renderings of region graphs and region changes: Rich trees and panels
(``tree``, ``changes``) and Graphviz diagrams (``dot``)."""
