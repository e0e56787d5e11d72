"""A fitted regression forest as flat node arrays: per-tree predictions in plain Python, saved without pickle.

scikit-learn fits the forests; `modak plan` only predicts, and importing scikit-learn alone costs more than the
whole plan should (about 1.4 s of a 2 s plan), importing NumPy about a seventh of it. A :class:`TreeEnsemble`
keeps every tree's nodes in flat standard-library arrays (children, split feature, threshold, leaf value) and
predicts as scikit-learn's own trees do (features rounded to float32, ``x <= threshold`` goes left): a plan
predicts a few dozen candidates, a few thousand node visits per forest. The per-tree values are what the
prediction interval is made of, so an ONNX export (which sums the trees inside the operator) would not do.

Files (:func:`encode_arrays`, :func:`load_arrays`): a magic line, one line of JSON (a header, the arrays' names,
types and lengths, and the CRC-32 of their bytes), then the arrays' bytes, little-endian. Only integer and float
arrays are read; nothing in a file is executed; a file whose bytes are not the ones written is refused whole. The
files are modak's own cache, written atomically: the checksum is there to catch a damaged disk or a copy cut
short, for which CRC-32 is made; it is checked once per content of a file (:func:`load_arrays`). Within a file the
checksum vouches for, child indices are not scanned on load (that scan cost a warm plan more than its walks): a
walk takes at most ``depth`` steps, and a child index past the nodes is a ValueError there.
"""

from __future__ import annotations

import json
import mmap
import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TypeAlias

from modak.paths import content_entry, write_atomic

LEAF = -1  # scikit-learn's TREE_LEAF: a node without children
MAGIC = b"modak-arrays 3\n"
_TYPES = {"q": 8, "d": 8}  # int64, float64
_NAMES = ("roots", "left", "right", "feature", "threshold", "value", "depth")
_CODES = ("q", "q", "q", "q", "d", "d", "q")

Ints: TypeAlias = "array | memoryview[int]"  # an int64 array, or a view of a mapped file's bytes as one
Floats: TypeAlias = "array | memoryview[float]"  # the same of float64
Values: TypeAlias = "Ints | Floats"


@dataclass(frozen=True, eq=False)
class TreeEnsemble:
    """Trees in flat node arrays; tree ``t``'s root is node ``roots[t]``; children are global node indices."""

    roots: Ints  # int64, one per tree
    left: Ints  # int64 per node, LEAF at leaves
    right: Ints  # int64 per node
    feature: Ints  # int64 per node (meaningless at leaves)
    threshold: Floats  # float64 per node
    value: Floats  # float64 per node: the leaf's prediction
    depth: Ints  # int64, one value: the longest root-to-leaf path, in edges (no walk takes more steps)

    @classmethod
    def from_sklearn(cls, forest: Any) -> TreeEnsemble:
        """The trees of a fitted scikit-learn ``RandomForestRegressor`` (single output)."""
        import numpy as np

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
        def ints(parts: list) -> array:
            return array("q", np.concatenate(parts).astype(np.int64).tolist())

        def floats(parts: list) -> array:
            return array("d", np.concatenate(parts).astype(np.float64).tolist())

        return cls(array("q", roots), ints(left), ints(right), ints(feature), floats(threshold), floats(value),
                   array("q", [depth]))

    @property
    def trees(self) -> int:
        return len(self.roots)

    @cached_property
    def features(self) -> int:
        """How many features a row needs: one past the highest split feature."""
        return max(self.feature) + 1

    def predict_trees(self, X: Sequence[Sequence[float]]) -> list[list[float]]:
        """Each tree's prediction for each row of ``X``: ``trees`` lists of ``len(X)`` values."""
        rows = [array("f", row) for row in X]  # scikit-learn compares float32 features
        if any(len(row) < self.features for row in rows):
            raise ValueError(f"the trees split on {self.features} features; a row has fewer")
        left, right, feature, threshold, value = self.left, self.right, self.feature, self.threshold, self.value
        steps = range(self.depth[0])
        out = []
        try:
            for root in self.roots:
                per_row = []
                for row in rows:
                    node = root
                    for _ in steps:
                        if left[node] == LEAF:
                            break
                        node = left[node] if row[feature[node]] <= threshold[node] else right[node]
                    per_row.append(value[node])
                out.append(per_row)
        except IndexError:
            raise ValueError("the tree arrays point outside the trees") from None
        return out

    def predict(self, X: Sequence[Sequence[float]]) -> list[float]:
        """The forest's prediction (mean over trees) for each row of ``X``."""
        per_tree = self.predict_trees(X)
        return [sum(column) / len(per_tree) for column in zip(*per_tree)]

    def arrays(self, prefix: str) -> dict[str, Values]:
        """The ensemble as named arrays (for :func:`encode_arrays`)."""
        return {f"{prefix}.{name}": getattr(self, name) for name in _NAMES}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Values], prefix: str) -> TreeEnsemble:
        """Inverse of :meth:`arrays`; checks the arrays' types and lengths and that the roots and split features
        are in range (child indices are checked by the walk, which takes at most ``depth`` steps, so none loops)."""
        parts = {name: arrays[f"{prefix}.{name}"] for name in _NAMES}
        if tuple(typecode(parts[n]) for n in _NAMES) != _CODES:
            raise ValueError(f"wrong array types for {prefix}")
        nodes = len(parts["left"])
        if not parts["roots"] or len(parts["depth"]) != 1 or any(
                len(parts[n]) != nodes for n in ("right", "feature", "threshold", "value")):
            raise ValueError(f"inconsistent tree arrays for {prefix}")
        if not (0 <= min(parts["roots"]) and max(parts["roots"]) < nodes and min(parts["feature"]) >= 0
                and 0 <= parts["depth"][0] <= nodes):
            raise ValueError(f"tree arrays for {prefix} point outside the trees")
        return cls(**parts)  # type: ignore[arg-type]  # each typecode was checked above


def encode_arrays(header: Mapping[str, Any], arrays: Mapping[str, Values]) -> bytes:
    """The bytes of a file holding ``header`` (JSON) and ``arrays`` (int64 ``q`` or float64 ``d``)."""
    index = [[name, typecode(values), len(values)] for name, values in arrays.items()]
    if any(code not in _TYPES for _, code, _ in index):
        raise ValueError("only int64 and float64 arrays are saved")
    payload = b"".join(_little_endian(values).tobytes() for values in arrays.values())
    meta = {"header": header, "arrays": index, "crc32": zlib.crc32(payload)}
    return b"".join([MAGIC, json.dumps(meta).encode() + b"\n", payload])


def load_arrays(path: Path) -> tuple[dict[str, Any], dict[str, Values]]:
    """The header and arrays of a file of :func:`encode_arrays`' bytes; a damaged file is a ValueError.

    The file is mapped, not read: each array is a view of its bytes (a copy only on a big-endian machine), so a
    plan pages in the nodes its walks visit, not the whole file. Its CRC-32 is checked on the first load of this
    content (path, size, modification time, inode) and remembered in modak's cache, so a warm plan does not read
    every byte to check it again."""
    with path.open("rb") as handle:
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise ValueError(f"{path} is not a modak arrays file") from None
    view = memoryview(data)
    if view[:len(MAGIC)] != MAGIC:
        raise ValueError(f"{path} is not a modak arrays file")
    try:
        end = data.find(b"\n", len(MAGIC))
        meta = json.loads(view[len(MAGIC):end].tobytes())
        header, index = dict(meta["header"]), [(str(n), str(c), int(k)) for n, c, k in meta["arrays"]]
        checksum = int(meta["crc32"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: bad index ({exc})") from None
    position = payload = end + 1
    arrays: dict[str, Values] = {}
    for name, code, length in index:
        if code not in _TYPES or length < 0:
            raise ValueError(f"{path}: bad array entry {name!r}")
        size = _TYPES[code] * length
        if position + size > len(view):
            raise ValueError(f"{path} is truncated")
        arrays[name] = _native(view[position:position + size], code)
        position += size
    if position != len(view):
        raise ValueError(f"{path} has trailing bytes")
    verified = content_entry(path, "verified")
    if not verified.exists():
        if zlib.crc32(view[payload:]) != checksum:
            raise ValueError(f"{path}: its arrays are not the ones written (damaged)")
        write_atomic(verified, str(checksum))
    return header, arrays


def _native(raw: memoryview, code: str) -> Values:
    """Little-endian bytes ``raw`` as values of type ``code``: a view of them, or a swapped copy on a big-endian
    machine."""
    if sys.byteorder == "little":
        return raw.cast("q") if code == "q" else raw.cast("d")
    values = array(code, raw.tobytes())
    values.byteswap()
    return values


def typecode(values: Values) -> str:
    """The element type of an array or of a view of one (``q``, ``d``)."""
    return values.typecode if isinstance(values, array) else values.format


def _little_endian(values: Values) -> Values:
    """``values`` in little-endian order: a copy, swapped, on a big-endian machine."""
    if sys.byteorder == "little":
        return values
    swapped = array(typecode(values), values)
    swapped.byteswap()
    return swapped
