"""EAGLE (Li et al., ICML 2024) and EAGLE-2 (Li et al., EMNLP 2024): feature-level drafts (docs/methods/eagle.md).

The draft is a small head (``specbench.models.eagle_heads``) run on the TARGET's features: its input at
position i is the pair (f_i, x_{i+1}) of the target's last hidden state at i and the token after it; its
output is the predicted feature f̂_{i+1}, which the target's own LM head turns into the draft distribution
of x_{i+2}. Deeper drafts feed the head's own predicted features back in.

The head keeps its own KV cache (``HeadCache``). Between steps it holds the committed pairs 0..p-1
(true target features only): the prompt's come from ``observe_prompt`` (the prefill's hidden states),
later ones from the verify pass (``verified.hidden`` at the accepted path: f_p .. f_{p+a}, paired with
the accepted tokens and the token the target emitted). Each step first feeds the pairs committed since
the last step in one forward; its last output f̂_p gives q(.|root). Tree rows (pairs built on predicted
features) are appended layer by layer under a tree mask and dropped after the step, so the cache rolls
back to the accepted path and always equals what feeding the committed pairs from scratch would give.

Three trees, one drafter base:

- ``Eagle`` (``method=eagle``): EAGLE-1's static tree (the published 25-node tree ``eagle1``, a binary
  tree, or any rank paths). At T = 0 a rank-r child is the head's r-th most likely token; at T > 0 the
  children are ordered draws without replacement from the warped q (``sample_children``), recorded in
  ``draft_probs`` for the ``speculative`` rule, as the official EAGLE-1 code samples and verifies.
- ``Eagle2`` (``method=eagle2``): EAGLE-2's dynamic tree (``ExpandRerankBuilder``): expand the top_k
  nodes by path confidence for ``depth`` layers, then keep the ``total_tokens - 1`` most confident
  nodes. The tree is a deterministic function of the context, verified at T > 0 by one-hot
  multi-candidate rejection (the official EAGLE-2 rule: q = 1 for every drafted token).
- ``EagleOptTree`` (``method=opt_tree_eagle``): OPT-Tree's construction (``OptTreeBuilder``) over the
  head's distributions, as OPT-Tree's Tables 1-3 run it with EAGLE drafts.
- ``Eagle3`` (``method=eagle3``, docs/methods/eagle3.md): EAGLE-2's dynamic tree drafted by an EAGLE-3 head
  (``specbench.models.eagle3_heads``): the committed pairs carry three target layers fused (the loop hands
  them over through ``hidden_layers``), the head scores its own (reduced) vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specbench.core.acceptance import Acceptance
from specbench.core.drafter import DecodeContext, Drafter, knob_choice, knob_int, knob_number
from specbench.core.tree import DraftTree
from specbench.core.verify import VerifyOutput, compact_cache, new_cache
from specbench.drafters.tree_fill import fill_shape
from specbench.errors import ConfigError
from specbench.models.eagle3_heads import Eagle3Head, load_eagle3
from specbench.models.eagle_heads import EagleHead, load_head
from specbench.models.vocab import DraftVocabulary, ReducedHead, draft_vocabulary, size_knob
from specbench.structures.tree_builders import ExpandRerankBuilder, OptTreeBuilder
from specbench.structures.tree_rows import TreeRowMask
from specbench.structures.tree_shapes import PUBLISHED_TREES, fixed_shape

SHAPES = (*PUBLISHED_TREES, "binary", "paths")


class HeadCache:
    """The EAGLE head with its own KV cache: the committed pairs (true target features), then tree rows.

    Pair i = (f_i, x_{i+1}) sits at position i; ``committed`` pairs are cached between steps. A tree
    node at depth d under a root at position p is the pair (its parent's predicted feature, its token)
    at position p + d - 1, seeing the committed pairs, its ancestors' tree rows and itself.
    """

    def __init__(self, head: EagleHead | Eagle3Head, to_logits: Callable[[torch.Tensor], torch.Tensor]):
        self.head = head
        self.to_logits = to_logits  # the head's outputs [k, H] -> draft logits over the target vocabulary [k, vocab]
        self.reset()

    def reset(self) -> None:
        """An empty cache for a new generation; counters back to zero."""
        self.cache = new_cache(self.head)
        self.committed = 0
        self.forwards = 0  # head forwards this generation
        self.rows = 0  # pairs fed through the head this generation
        self._drop_tree_state()

    @property
    def device(self) -> torch.device:
        return self.head.fc.weight.device

    def extend(self, features: torch.Tensor, tokens: list[int]) -> torch.Tensor:
        """Append committed pairs (features [k, H], next tokens [k]) causally; their predicted features [k, H]."""
        self.drop_tree()
        k, past = len(tokens), self.committed
        mask = torch.zeros(k, past + k, dtype=self.head.fc.weight.dtype)  # [k, past + k] additive
        mask[:, past:].masked_fill_(torch.ones(k, k, dtype=torch.bool).triu(1), torch.finfo(mask.dtype).min)
        positions = torch.arange(past, past + k)  # [k]
        out = self._forward(features, tokens, positions, mask)
        self.committed += k
        return out

    def tree_layer(self, features: torch.Tensor, tokens: list[int], parent_rows: list[int], depth: int) -> torch.Tensor:
        """Feed one tree layer at ``depth`` (features [k, H] of each node's parent, tokens [k]); outputs [k, H].

        ``parent_rows[i]`` is the tree row of node i's parent (-1: the root, whose pair is the last committed one).
        """
        k = len(tokens)
        mask = self._tree_mask.add(parent_rows, self.committed, self.head.fc.weight.dtype)  # [k, cached + k]
        positions = torch.full((k,), self.committed - 1 + depth)  # [k]
        out = self._forward(features, tokens, positions, mask)
        self.tree_rows += k
        return out

    def drop_tree(self) -> None:
        """Roll back to the committed pairs: drop this step's tree rows."""
        if self.tree_rows:
            compact_cache(self.cache, self.committed, [])
        self._drop_tree_state()

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Draft logits [k, vocab] (float32) of the head's outputs [k, H] (EAGLE: through the target's LM head)."""
        return self.to_logits(features).float()

    def _forward(
        self, features: torch.Tensor, tokens: list[int], positions: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """One head forward over k pairs after the cached rows; predicted features [k, H]."""
        device = self.device
        out = self.head(
            features.to(device=device, dtype=self.head.fc.weight.dtype)[None],  # [1, k, H]
            torch.tensor([tokens], device=device),  # [1, k]
            positions.to(device)[None],  # [1, k]
            mask.to(device)[None, None],  # [1, 1, k, cached + k]
            self.cache,
        )
        self.forwards += 1
        self.rows += len(tokens)
        return out[0]

    def _drop_tree_state(self) -> None:
        """Forget the current step's tree rows."""
        self.tree_rows = 0
        self._tree_mask = TreeRowMask()  # which tree rows each tree row sees


class EagleDrafter(Drafter):
    """Base of the EAGLE drafters: loads the head, keeps its cache on the committed pairs, counts.

    Subclasses implement ``draft_tree(ctx, root_feature, root_logits)``: the tree to verify, from the
    head's output at the root (f̂_p [H]) and its logits [vocab].
    """

    hidden_layers: tuple[int, ...] = (-1,)  # the last hidden states (after the final norm)
    COUNTERS = ("steps", "drafted", "accepted_tokens", "depth_sum")
    reads_sampling = True

    def __init__(
        self,
        head=None,
        target_name: str = "target",
        draft_vocab: int | None = None,
    ):
        super().__init__()
        self.head_cfg = head
        self.target_name = target_name
        self.draft_vocab = size_knob(draft_vocab)
        self.vocabulary: DraftVocabulary | None = None
        self.loaded_head: HeadCache | None = None
        self.origin = ""
        self.trained_top1: list[float] | None = None
        self.pending: torch.Tensor | None = None  # [m, H] target features of positions committed.. not yet fed
        self.reached: list[int] = []  # steps whose accepted path reached depth d + 1

    def setup(self, target, tokenizer) -> None:
        """Load the head for this target (the model config's ``eagle:`` node) and its output layer: the target's
        LM head, restricted to the ``draft_vocab`` most frequent tokens when that is set."""
        loaded = load_head(self.head_cfg, target, self.target_name)
        lm_head = target.get_output_embeddings()
        self.vocabulary = draft_vocabulary(self.draft_vocab, self.target_name, lm_head.weight.shape[0])
        to_logits = ReducedHead(lm_head.weight, self.vocabulary.tokens) if self.vocabulary else lm_head
        self.loaded_head = HeadCache(loaded.head, to_logits)
        self.origin, self.trained_top1 = loaded.origin, loaded.top1_by_depth

    def artefacts(self) -> list[str]:
        """The reduced draft vocabulary, when one is used (its ranking's digest and size)."""
        return [self.vocabulary.part] if self.vocabulary else []

    @property
    def draft(self) -> HeadCache:
        """The head and its cache, loaded by ``setup``."""
        if self.loaded_head is None:
            raise RuntimeError(f"{type(self).__name__}.setup(target, tokenizer) must load the head first")
        return self.loaded_head

    def reset(self, prompt_ids: list[int]) -> None:
        """An empty head cache; the prompt's features arrive with ``observe_prompt``."""
        self.draft.reset()
        self.pending = None
        self.reached = []

    def observe_prompt(self, hidden: torch.Tensor) -> None:
        """The prefill's features f_0 .. f_{P-1} ([P, H]): the first step feeds them as pairs."""
        self.pending = hidden

    def propose(self, ctx: DecodeContext) -> DraftTree:
        """Feed the pairs committed since the last step, then draft this step's tree from f̂_p."""
        root_feature, root_logits = self._catch_up(ctx)
        tree = self.draft_tree(ctx, root_feature, root_logits)
        self.books.add(steps=1, drafted=tree.num_drafted)
        return tree

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified: VerifyOutput, accepted: Acceptance) -> None:
        """Drop the tree rows; keep the target's features of the accepted path for the next step's pairs."""
        self.draft.drop_tree()
        assert verified.hidden is not None  # the verify pass returns it to drafters with hidden_layers
        self.pending = verified.hidden[accepted.path]  # [len(path), H]: f_p .. f_{p + accepted}
        accepted_tokens = len(accepted.path) - 1
        self.books.add(accepted_tokens=accepted_tokens, depth_sum=max(tree.depths))
        self.reached.extend([0] * (accepted_tokens - len(self.reached)))
        for depth in range(accepted_tokens):
            self.reached[depth] += 1

    def draft_tree(self, ctx: DecodeContext, root_feature: torch.Tensor, root_logits: torch.Tensor) -> DraftTree:
        """The tree to verify; node 0 is ``ctx.root``."""
        raise NotImplementedError

    def _catch_up(self, ctx: DecodeContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed pairs (f_i, x_{i+1}) for i = committed .. p - 1; return f̂_p [H] and its logits [vocab]."""
        if self.pending is None:
            raise RuntimeError(
                f"{type(self).__name__} needs the target's features of the committed tokens: the loop "
                f"passes the prompt's with observe_prompt (drafters with hidden_layers)"
            )
        start, position = self.draft.committed, ctx.position
        if self.pending.shape[0] != position - start:
            raise RuntimeError(
                f"EAGLE head cache out of step: {self.pending.shape[0]} new features for positions "
                f"{start}..{position - 1}"
            )
        out = self.draft.extend(self.pending, ctx.tokens[start + 1 : position + 1])  # [k, H]
        self.pending = None
        root_feature = out[-1]  # [H] f̂_p
        return root_feature, self.draft.logits(root_feature[None])[0]

    def stats(self) -> dict:
        """Head origin, drafted / accepted tokens per step, head forwards, acceptance by depth."""
        books = self.books
        steps = books.counts["steps"]
        return {
            **books.report(),
            "head": self.origin,
            "drafted_per_step": books.per("drafted", "steps"),
            "accepted_per_step": books.per("accepted_tokens", "steps"),
            "draft_hit_ratio": books.per("accepted_tokens", "drafted"),
            "tree_depth_mean": books.per("depth_sum", "steps"),
            "depth_accept_rate": [round(n / steps, 4) for n in self.reached] if steps else [],
            "head_forwards": self.loaded_head.forwards if self.loaded_head else 0,
            "head_rows": self.loaded_head.rows if self.loaded_head else 0,
            "trained_top1_by_depth": self.trained_top1,
        }


class Eagle(EagleDrafter):
    """EAGLE-1: a static tree filled by the head depth by depth (one head forward per depth with children)."""

    def __init__(
        self, shape: str = "eagle1", nodes: int | None = 30, paths=None, sample_children: bool = True, **settings
    ):
        self.shape = fixed_shape(knob_choice("shape", shape, SHAPES), nodes, paths)
        super().__init__(**settings)
        self.sample_children = bool(sample_children)

    def setup(self, target, tokenizer) -> None:
        """Load the head; refuse shapes that want more children per node than the vocabulary has."""
        super().setup(target, tokenizer)
        widest = max(len(kids) for kids in self.shape.children())
        vocab = len(self.vocabulary.tokens) if self.vocabulary else target.get_output_embeddings().weight.shape[0]
        if widest > vocab:
            raise ConfigError(
                f"the tree shape gives a node {widest} children but the vocabulary has only {vocab} tokens"
            )

    def draft_tree(self, ctx: DecodeContext, root_feature: torch.Tensor, root_logits: torch.Tensor) -> DraftTree:
        """Fill the shape (pruned to the budget) depth by depth, one head forward per depth with children."""
        shape = self.shape.pruned(ctx.remaining - 1)
        if len(shape) == 1:
            return DraftTree.root_only(ctx.root)
        features = {0: root_feature}  # node -> its predicted feature f̂ (what its children's pairs carry)
        rows = {0: -1}  # node -> its head-cache tree row (-1: the root, the last committed pair)

        def feed(depth: int, nodes: list[int], tokens: list[int]) -> torch.Tensor:
            first = self.draft.tree_rows
            parents = [shape.parents[node] for node in nodes]
            parent_features = torch.stack([features[parent] for parent in parents])  # [k, H]
            out = self.draft.tree_layer(
                parent_features, [tokens[node] for node in nodes], [rows[parent] for parent in parents], depth
            )  # [k, H]
            for i, node in enumerate(nodes):
                rows[node], features[node] = first + i, out[i]
            return self.draft.logits(out)  # [k, vocab]

        return fill_shape(shape, ctx.root, root_logits, feed, ctx.draft_law(self.sample_children), ctx.generator)


class LayerFeeder:
    """Feeds a tree layer by layer for the dynamic builders: remembers each fed node's feature and tree row."""

    def __init__(self, draft: HeadCache, root_feature: torch.Tensor):
        self.draft = draft
        self.root_feature = root_feature  # [H] f̂_p: what layer-1 pairs carry
        self.features: dict[int, torch.Tensor] = {}  # index in the newest fed layer -> predicted feature [H]
        self.rows: dict[int, int] = {}  # index in the newest fed layer -> head-cache tree row

    def feed(self, nodes: list[int], tokens: list[int], parents: list[int], depth: int) -> torch.Tensor:
        """Feed ``nodes`` (indices in layer ``depth``) with their tokens and parent indices (-1: root); their
        draft logits [k, vocab]."""
        parent_features = torch.stack([self.features[p] if p >= 0 else self.root_feature for p in parents])  # [k, H]
        parent_rows = [self.rows[p] if p >= 0 else -1 for p in parents]
        first = self.draft.tree_rows
        out = self.draft.tree_layer(parent_features, tokens, parent_rows, depth)  # [k, H]
        self.features = {node: out[i] for i, node in enumerate(nodes)}
        self.rows = {node: first + i for i, node in enumerate(nodes)}
        return self.draft.logits(out)


class Eagle2(EagleDrafter):
    """EAGLE-2's dynamic tree: expansion of the top_k most confident nodes for ``depth`` layers, then reranking."""

    def __init__(self, top_k: int = 10, depth: int = 5, total_tokens: int = 60, **settings):
        self.top_k = knob_int("top_k", top_k, 1, "k")
        self.depth = knob_int("depth", depth, 1, "d")
        self.total_tokens = knob_int("total_tokens", total_tokens, 2, "m")
        super().__init__(**settings)

    def draft_tree(self, ctx: DecodeContext, root_feature: torch.Tensor, root_logits: torch.Tensor) -> DraftTree:
        """Layers 1 .. depth + 1 (each expansion feeds the newest layer's top_k), then the total_tokens - 1 best.

        Expansion stops early once no deeper node could be among the total_tokens - 1 best: the same tree,
        fewer head forwards."""
        layers = min(self.depth + 1, ctx.remaining - 1)  # drafted layers; deeper nodes could never be emitted
        if layers < 1:
            return DraftTree.root_only(ctx.root)
        builder = ExpandRerankBuilder(self.top_k)
        builder.add_layer(torch.log_softmax(root_logits, dim=-1)[None])  # [1, vocab]
        feeder = LayerFeeder(self.draft, root_feature)
        while builder.depth < layers and builder.can_improve(self.total_tokens - 1):
            fed = builder.frontier
            logits = feeder.feed(fed, builder.frontier_tokens, [builder.parents[-1][i] for i in fed], builder.depth)
            builder.add_layer(torch.log_softmax(logits, dim=-1))  # [top_k, vocab]
        tree, _ = builder.tree(ctx.root, self.total_tokens - 1)
        return tree


class EagleOptTree(EagleDrafter):
    """OPT-Tree over the EAGLE head: node budget n, threshold delta, depth counter max_depth (as ``opt_tree``)."""

    def __init__(self, nodes: int = 50, threshold: float = 0.5, max_depth: int = 10, **settings):
        self.nodes = knob_int("nodes", nodes, 1, "n")
        self.max_depth = knob_int("max_depth", max_depth, 2)
        self.threshold = knob_number("threshold", threshold, 0.0, symbol="delta")
        super().__init__(**settings)
        self.step_expected: list[float] = []  # per step: E, the sum of p̂ over the verified tree
        self.step_accepted: list[int] = []  # per step: drafted tokens accepted

    def reset(self, prompt_ids: list[int]) -> None:
        """A fresh head cache and fresh per-step E / acceptance traces."""
        super().reset(prompt_ids)
        self.step_expected, self.step_accepted = [], []

    def draft_tree(self, ctx: DecodeContext, root_feature: torch.Tensor, root_logits: torch.Tensor) -> DraftTree:
        """Build layers while E grows by more than delta (each layer one head forward over all n nodes above)."""
        depth_limit = min(self.max_depth - 1, ctx.remaining - 1)
        if depth_limit < 1:
            self.step_expected.append(0.0)
            return DraftTree.root_only(ctx.root)
        builder = OptTreeBuilder(self.nodes)
        builder.add_layer(torch.softmax(root_logits, dim=-1)[None])  # [1, vocab] raw q(.|root)
        feeder = LayerFeeder(self.draft, root_feature)
        while builder.grows(self.threshold, depth_limit):
            nodes = list(range(len(builder.tokens[-1])))
            logits = feeder.feed(nodes, builder.tokens[-1], builder.parents[-1], builder.depth)  # [n, vocab]
            builder.add_layer(torch.softmax(logits, dim=-1))
        tree, _, expected = builder.tree(ctx.root)
        self.step_expected.append(round(expected, 3))
        return tree

    def observe(self, ctx: DecodeContext, tree: DraftTree, verified: VerifyOutput, accepted: Acceptance) -> None:
        """Base bookkeeping, plus this step's actual acceptance next to its E."""
        super().observe(ctx, tree, verified, accepted)
        self.step_accepted.append(len(accepted.path) - 1)

    def stats(self) -> dict:
        """Base stats plus E (sum of p̂ of the verified tree) and the accepted drafted tokens, per step."""
        return {
            **super().stats(),
            "expected_accept_mean": sum(self.step_expected) / max(len(self.step_expected), 1),
            "step_expected_accept": self.step_expected,
            "step_accepted": self.step_accepted,
        }


class Eagle3(Eagle2):
    """EAGLE-3: EAGLE-2's dynamic tree from an EAGLE-3 head fed the target's low, middle and high layers.

    ``part`` is the part kind whose trained heads ``source: trained`` loads: ``eagle3``, or ``eagle3_1`` (EAGLE-3.1's
    heads, trained apart); the head's own config.json says which norms it has.
    """

    def __init__(self, *args, part: str = "eagle3", **kwargs):
        super().__init__(*args, **kwargs)
        self.part = part

    def setup(self, target, tokenizer) -> None:
        """Load the head (the model config's ``eagle3:`` node) and ask the loop for the layers it fuses."""
        if self.draft_vocab is not None:
            raise ConfigError(
                "method.drafter.draft_vocab does not apply to EAGLE-3: its head has its own draft vocabulary "
                "(python -m specbench.train eagle3 head.draft_vocab_size=N); drop the override"
            )
        loaded = load_eagle3(self.head_cfg, target, self.target_name, self.part)
        self.hidden_layers = loaded.layers
        self.loaded_head = HeadCache(loaded.head, loaded.head.target_logits)
        self.origin, self.trained_top1 = loaded.origin, loaded.top1_by_depth

    def artefacts(self) -> list[str]:
        """The head (``eagle3:<weights digest>`` when trained here, else its Hub id or seed), so a run resumed
        with another head is refused."""
        return [self.origin] if self.origin else []
