"""The learned predictor's tree file (``lmc-gbm 1``, engine/predictor.h; written by
harness.predictor.train), read for what the audit counts in it: which feature each split reads.

The file holds no split gains, so the importance the audit can compute from it is the split count
(each feature's share of the splits). Every error names the file and the line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from reports.errors import ReportInputError

NODE_FIELDS = 7  # feature threshold left right is_leaf value missing_left


@dataclass(frozen=True)
class TreeFile:
    path: Path
    names: tuple[str, ...]  # the features, in the file's order
    splits: tuple[tuple[int, ...], ...]  # per layer: how many splits read each feature
    trees: int  # in all layers

    def counts(self, layer: int | None = None) -> dict[str, int]:
        """Splits per feature name, pooled over the layers (or of one layer)."""
        rows = self.splits if layer is None else (self.splits[layer],)
        return {name: sum(row[i] for row in rows) for i, name in enumerate(self.names)}

    def shares(self, layer: int | None = None) -> dict[str, float]:
        """Each feature's share of the splits (0 for all when there are none)."""
        counts = self.counts(layer)
        total = sum(counts.values())
        return {name: (n / total if total else 0.0) for name, n in counts.items()}


class _Lines:
    """The file's lines with their numbers, for errors that point at one."""

    def __init__(self, text: str, path: Path) -> None:
        self.path = path
        self._lines: Iterator[tuple[int, str]] = enumerate(text.splitlines(), start=1)
        self.number = 0

    def fail(self, message: str) -> ReportInputError:
        return ReportInputError(f"{self.path}:{self.number}: {message}")

    def words(self, what: str) -> list[str]:
        line = next(self._lines, None)
        if line is None:
            raise self.fail(f"the file ends where {what} was expected")
        self.number = line[0]
        return line[1].split()

    def header(self, word: str, size: int) -> list[str]:
        """A line ``word`` plus ``size - 1`` fields."""
        words = self.words(f"a '{word}' line")
        if len(words) < size or words[0] != word:
            raise self.fail(f"expected a '{word}' line, got {' '.join(words)!r}")
        return words

    def integer(self, text: str, what: str, low: int = 0) -> int:
        try:
            value = int(text)
        except ValueError:
            raise self.fail(f"{what} must be an integer, got {text!r}") from None
        if value < low:
            raise self.fail(f"{what} must be at least {low}, got {value}")
        return value


def parse_trees(text: str, path: Path) -> TreeFile:
    lines = _Lines(text, path)
    if lines.header("lmc-gbm", 2)[1] != "1":
        raise lines.fail("only format version 1 is known (`benchfarm predictor study` writes it)")
    words = lines.header("features", 2)
    n_features = lines.integer(words[1], "the feature count", 1)
    names = tuple(words[2:])
    if len(names) != n_features:
        raise lines.fail(f"{n_features} features announced, {len(names)} named")
    n_layers = lines.integer(lines.header("layers", 2)[1], "the layer count", 1)
    splits, trees = [], 0
    for layer in range(n_layers):
        words = lines.header("layer", 6)
        if lines.integer(words[1], "the layer index") != layer or words[4] != "trees":
            raise lines.fail(f"expected 'layer {layer} baseline B trees T'")
        counts = [0] * n_features
        for _ in range(lines.integer(words[5], "the tree count")):
            nodes = lines.integer(lines.header("tree", 2)[1], "the node count", 1)
            for _ in range(nodes):
                node = lines.words("a node")
                if len(node) != NODE_FIELDS:
                    raise lines.fail(f"a node has {NODE_FIELDS} fields, got {len(node)}")
                if lines.integer(node[4], "is_leaf") == 0:
                    feature = lines.integer(node[0], "the feature index")
                    if feature >= n_features:
                        raise lines.fail(f"feature {feature} of a split: the file names "
                                         f"{n_features}")
                    counts[feature] += 1
            trees += 1
        splits.append(tuple(counts))
    return TreeFile(path=path, names=names, splits=tuple(splits), trees=trees)


def read_trees(path: str | Path) -> TreeFile:
    path = Path(path)
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportInputError(f"cannot read the tree file {path}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
    return parse_trees(text, path)
