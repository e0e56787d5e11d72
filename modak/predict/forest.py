"""A fitted regression forest as plain arrays: per-tree predictions in NumPy, saved without pickle.

scikit-learn fits the forests; `modak plan` only predicts, and importing scikit-learn alone costs more than the
whole plan should (about 1.4 s of a 2 s plan). A :class:`TreeEnsemble` keeps every tree's nodes in flat arrays
(children, split feature, threshold, leaf value), predicts all trees for all rows at once, as scikit-learn's own
trees do (rows cast to float32, ``x <= threshold`` goes left), and round-trips through ``numpy.savez`` loaded
with ``allow_pickle=False``. The per-tree values are what the prediction interval is made of, so an ONNX export
(which sums the trees inside the operator) would not do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

LEAF = -1  # scikit-learn's TREE_LEAF: a node without children


@dataclass(frozen=True, eq=False)
class TreeEnsemble:
    """Trees in flat node arrays; tree ``t``'s root is node ``roots[t]``; children are global node indices."""

    roots: np.ndarray  # int64, one per tree
    left: np.ndarray  # int64 per node, LEAF at leaves
    right: np.ndarray  # int64 per node
    feature: np.ndarray  # int64 per node (meaningless at leaves)
    threshold: np.ndarray  # float64 per node
    value: np.ndarray  # float64 per node: the leaf's prediction
    depth: int  # the longest root-to-leaf path, in edges

    @classmethod
    def from_sklearn(cls, forest: Any) -> TreeEnsemble:
        """The trees of a fitted scikit-learn ``RandomForestRegressor`` (single output)."""
        roots, left, right, feature, threshold, value = [], [], [], [], [], []
        offset = 0
        depth = 0
        for estimator in forest.estimators_:
            tree = estimator.tree_
            leaves = tree.children_left == LEAF
            roots.append(offset)
            left.append(np.where(leaves, LEAF, tree.children_left + offset))
            right.append(np.where(leaves, LEAF, tree.children_right + offset))
            feature.append(np.where(leaves, 0, tree.feature))  # scikit-learn marks leaves -2
            threshold.append(tree.threshold)
            value.append(tree.value.reshape(tree.node_count, -1)[:, 0])
            offset += tree.node_count
            depth = max(depth, int(tree.max_depth))
        return cls(np.array(roots, dtype=np.int64), *(np.concatenate(a).astype(np.int64) for a in (left, right, feature)),
                   np.concatenate(threshold).astype(np.float64), np.concatenate(value).astype(np.float64), depth)

    @property
    def trees(self) -> int:
        return len(self.roots)

    def predict_trees(self, X: np.ndarray) -> np.ndarray:
        """Each tree's prediction for each row of ``X``: shape (trees, rows)."""
        X = np.asarray(X, dtype=np.float32)
        rows = np.arange(len(X))
        node = np.repeat(self.roots[:, None], len(X), axis=1)
        for _ in range(self.depth):
            inner = self.left[node] != LEAF
            if not inner.any():
                break
            go_left = X[rows[None, :], self.feature[node]] <= self.threshold[node]
            node = np.where(inner, np.where(go_left, self.left[node], self.right[node]), node)
        return self.value[node]

    def predict(self, X: np.ndarray) -> np.ndarray:
        """The forest's prediction (mean over trees) for each row of ``X``."""
        return self.predict_trees(X).mean(axis=0)

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The ensemble as named arrays (for ``numpy.savez``)."""
        return {f"{prefix}.{name}": getattr(self, name) for name in ("roots", "left", "right", "feature", "threshold",
                                                                     "value")} | {
            f"{prefix}.depth": np.array(self.depth, dtype=np.int64)}

    @classmethod
    def from_arrays(cls, arrays: Any, prefix: str) -> TreeEnsemble:
        """Inverse of :meth:`arrays`; checks the node arrays agree, so a damaged file fails here."""
        parts = {name: np.asarray(arrays[f"{prefix}.{name}"]) for name in ("roots", "left", "right", "feature",
                                                                           "threshold", "value")}
        nodes = len(parts["left"])
        if any(len(parts[name]) != nodes for name in ("right", "feature", "threshold", "value")) or not (
                parts["roots"].size and nodes and parts["left"].max() < nodes and parts["right"].max() < nodes
                and parts["roots"].max() < nodes):
            raise ValueError(f"inconsistent tree arrays for {prefix}")
        return cls(parts["roots"].astype(np.int64), parts["left"].astype(np.int64), parts["right"].astype(np.int64),
                   parts["feature"].astype(np.int64), parts["threshold"].astype(np.float64),
                   parts["value"].astype(np.float64), int(arrays[f"{prefix}.depth"]))
