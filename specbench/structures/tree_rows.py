"""The attention mask of a draft tree grown layer by layer after the committed rows of a draft's own KV cache.

Shared by the draft models' cache (``specbench.drafters.draft_model.DraftLM``: SpeDe, OPT-Tree, fixed trees) and
EAGLE's head cache (``specbench.drafters.eagle.HeadCache``): a tree row sees every committed row, the tree rows of
its ancestors and itself, never a sibling's.
"""

from __future__ import annotations

import torch


class TreeRowMask:
    """Which of a step's tree rows each tree row may see (ancestors and itself), grown one layer at a time."""

    def __init__(self) -> None:
        self.visible = torch.zeros(0, 0, dtype=torch.bool)  # [rows, rows] ancestor-or-self among the tree rows

    def __len__(self) -> int:
        return self.visible.shape[0]

    def add(self, parent_rows: list[int], past: int, dtype: torch.dtype) -> torch.Tensor:
        """Append one row per entry of ``parent_rows`` (its parent's tree row, -1 = none: the root, a committed
        row); return their additive mask [k, past + rows + k] over the ``past`` committed rows and all tree rows."""
        k, rows = len(parent_rows), len(self)
        parents = torch.tensor(parent_rows, dtype=torch.long)  # [k]
        inherited = torch.zeros(k, rows, dtype=torch.bool)  # [k, rows] ancestors among earlier tree rows
        has_parent = parents >= 0
        inherited[has_parent] = self.visible[parents[has_parent]]
        visible = torch.cat([inherited, torch.eye(k, dtype=torch.bool)], dim=1)  # [k, rows + k]
        grown = torch.zeros(rows + k, rows + k, dtype=torch.bool)
        grown[:rows, :rows] = self.visible
        grown[rows:] = visible
        self.visible = grown
        mask = torch.zeros(k, past + rows + k, dtype=dtype)  # [k, past + rows + k] additive
        mask[:, past:].masked_fill_(~visible, torch.finfo(dtype).min)
        return mask
