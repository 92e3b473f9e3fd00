"""Walking ONNX graphs into the subgraphs their nodes hold (If branches, Loop and Scan
bodies).  Kept in the base package, with onnx as its only import, so that the model checker
can use it without importing the quantizer."""
from __future__ import annotations

from typing import Iterator

import onnx

__all__ = ["subgraphs", "all_nodes"]


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs held in ``node``'s attributes, in attribute order."""
    found = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            found.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            found.extend(a.graphs)
    return found


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of the subgraphs nested in it, each node before the
    nodes of its own subgraphs."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from all_nodes(sub)
