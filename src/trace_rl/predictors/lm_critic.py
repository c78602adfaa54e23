"""LM critic: any Hugging Face backbone (causal LM or encoder) with a scalar head and a sigmoid.

Input is the serialised prompt and history (the prompt, then per turn "action / Observation: ..."),
tokenised segment by segment with the critic's own tokenizer and truncated from the left when too long.

Prefix sharing (causal backbones): every prefix of one prompt shares the prompt, and the prefixes along one
trajectory are nested. So for each tree the prompt is encoded once, its KV cache is copied to the few
"endpoint" paths that cover every requested node, and one forward pass per endpoint yields the score of every
requested prefix on it (the hidden state at the last token of each turn). Encoders see both directions, so
they score each prefix on its own; only identical texts are deduplicated.

Training: binary cross-entropy on soft targets in [0, 1] (`training_examples`), AdamW, a replay
window, the head always trained and the backbone only with train_backbone=True. Qwen3-0.6B (the paper's
choice) is `LMCritic("Qwen/Qwen3-0.6B")`.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Sequence

import numpy as np

from ..lm.kv import cache_keyword, check_cache_grew
from ..lm.models import MINILM, SMOLLM2, minilm_path, smollm2_path
from ..tree import RolloutTree
from .base import Prefix
from .text import prompt_text


def _segments(tree: RolloutTree, node_id: str) -> list[str]:
    segs = [prompt_text(tree) + "\n"]
    for node in tree.path(node_id)[1:]:
        segs.append(f"{node.action}\nObservation: {node.observation}\n")
    return segs


class LMCritic:
    def __init__(
        self,
        backbone,
        tokenizer=None,
        max_length: int = 512,
        lr: float = 1e-4,
        train_backbone: bool = False,
        replay_steps: int = 4,
        epochs: int = 1,
        batch_size: int = 16,
        device: str = "cpu",
        seed: int = 0,
    ):
        import torch
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        self.torch = torch
        torch.manual_seed(seed)
        if isinstance(backbone, str):
            path = {MINILM: lambda: str(minilm_path()), SMOLLM2: lambda: str(smollm2_path())}.get(
                backbone, lambda: backbone
            )()
            try:
                config = AutoConfig.from_pretrained(path)
                tokenizer = AutoTokenizer.from_pretrained(path)
                backbone = AutoModel.from_pretrained(path)
            except OSError as err:
                raise FileNotFoundError(f"cannot load critic backbone {path!r}: {str(err).splitlines()[0]}") from None
        else:
            config = backbone.config
        if tokenizer is None:
            raise ValueError("pass the backbone's tokenizer with a model object")
        self.causal = not getattr(config, "is_encoder_decoder", False) and config.model_type not in (
            "bert",
            "roberta",
            "distilbert",
            "xlm-roberta",
            "electra",
            "mpnet",
            "deberta",
            "deberta-v2",
        )
        self.model, self.tok = backbone.to(device), tokenizer
        self.device, self.max_length = device, max_length
        hidden = getattr(config, "hidden_size", None) or config.d_model
        self.head = torch.nn.Linear(hidden, 1).to(device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.train_backbone = train_backbone
        params = list(self.head.parameters()) + (list(self.model.parameters()) if train_backbone else [])
        self.opt = torch.optim.AdamW(params, lr=lr)
        self.replay: deque = deque(maxlen=replay_steps)
        self.epochs, self.batch_size = epochs, batch_size
        self.stats = {"tokens_encoded": 0, "tokens_naive": 0}
        self.model.eval()

    # -- encoding ---------------------------------------------------------------------------------
    def _ids(self, segments: list[str]) -> tuple[list[int], list[int]]:
        """Token ids of the segments and the end offset of each; left-truncated to max_length."""
        ids, ends = [], []
        for seg in segments:
            ids += self.tok(seg, add_special_tokens=False).input_ids
            ends.append(len(ids))
        cut = max(0, len(ids) - self.max_length)
        return ids[cut:], [max(e - cut, 1) for e in ends]

    def _hidden(self, batch_ids: list[list[int]], past=None, past_len: int = 0, grad: bool = False):
        torch = self.torch
        width = max(len(x) for x in batch_ids)
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        ids = torch.full((len(batch_ids), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch_ids), past_len + width), dtype=torch.long)
        mask[:, :past_len] = 1
        for i, x in enumerate(batch_ids):
            ids[i, : len(x)] = torch.tensor(x)
            mask[i, past_len : past_len + len(x)] = 1
        kwargs = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}
        if past is not None:
            kwargs.update(
                {cache_keyword(self.model): past, "use_cache": True},
                position_ids=(past_len + torch.arange(width))[None].expand(len(batch_ids), -1).to(self.device),
            )
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            h = self.model(**kwargs).last_hidden_state
        if past is not None:
            check_cache_grew(self.model, past, past_len, width)
        return h, mask

    def _score_hidden(self, h):
        return self.torch.sigmoid(self.head(h.float())[..., 0])

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        if not len(prefixes):
            return np.zeros(0)
        with self.torch.no_grad():
            return self._predict_shared(prefixes) if self.causal else self._predict_each(prefixes)

    def _predict_each(self, prefixes) -> np.ndarray:
        texts = [tuple(_segments(t, n)) for t, n in prefixes]
        uniq = sorted(set(texts))
        scores, lengths = {}, {}
        for i in range(0, len(uniq), self.batch_size):
            chunk = uniq[i : i + self.batch_size]
            ids = [self._ids(list(t))[0] for t in chunk]
            h, mask = self._hidden(ids)
            pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
            for t, x, s in zip(chunk, ids, self._score_hidden(pooled).tolist()):
                scores[t], lengths[t] = s, len(x)
            self.stats["tokens_encoded"] += sum(len(x) for x in ids)
        self.stats["tokens_naive"] += sum(lengths[t] for t in texts)
        return np.array([scores[t] for t in texts])

    def _predict_shared(self, prefixes) -> np.ndarray:

        from transformers import DynamicCache

        out = np.zeros(len(prefixes))
        by_tree: dict[int, tuple[RolloutTree, list[int]]] = {}
        for k, (tree, _nid) in enumerate(prefixes):
            by_tree.setdefault(id(tree), (tree, []))[1].append(k)
        for tree, idx in by_tree.values():
            wanted = {prefixes[k][1] for k in idx}
            ends = [n for n in wanted if not any(o != n and o.startswith(n + ".") for o in wanted)]
            prompt_ids, _ = self._ids([prompt_text(tree) + "\n"])
            paths = [(e, self._ids(_segments(tree, e))) for e in ends]
            fits = all(ids[: len(prompt_ids)] == prompt_ids for _, (ids, _) in paths) and len(prompt_ids) > 1
            node_score: dict[str, float] = {}
            if fits:
                cache = DynamicCache()
                self._hidden([prompt_ids[:-1]], past=cache, past_len=0)
                cache.batch_repeat_interleave(len(paths))
                suffixes = [ids[len(prompt_ids) - 1 :] for _, (ids, _) in paths]
                h, _ = self._hidden(suffixes, past=cache, past_len=len(prompt_ids) - 1)
                offset = len(prompt_ids) - 1
                self.stats["tokens_encoded"] += offset + sum(len(s) for s in suffixes)
            else:  # truncation cut into the prompt: encode each endpoint path whole
                h, _ = self._hidden([ids for _, (ids, _) in paths])
                offset = 0
                self.stats["tokens_encoded"] += sum(len(ids) for _, (ids, _) in paths)
            scores = self._score_hidden(h)
            node_len: dict[str, int] = {}
            for row, (end, (_ids, bounds)) in enumerate(paths):
                for node, b in zip(tree.path(end), bounds):
                    node_score.setdefault(node.node_id, float(scores[row, b - 1 - offset]))
                    node_len.setdefault(node.node_id, min(b, self.max_length))
            for k in idx:
                out[k] = node_score[prefixes[k][1]]
            # what scoring each prefix alone would encode: its own (left-truncated) length
            self.stats["tokens_naive"] += sum(node_len[prefixes[k][1]] for k in idx)
        return out

    # -- training ---------------------------------------------------------------------------------
    def update(self, prefixes: Sequence[Prefix], targets: np.ndarray) -> float:
        torch = self.torch
        if not len(prefixes):
            return 0.0
        texts = [_segments(t, n) for t, n in prefixes]
        self.replay.append((texts, np.asarray(targets, float)))
        data = [(t, y) for texts_, ys in self.replay for t, y in zip(texts_, ys)]
        if self.train_backbone:
            self.model.train()
        losses = []
        rng = np.random.default_rng(len(data))
        for _ in range(self.epochs):
            order = rng.permutation(len(data))
            for i in range(0, len(order), self.batch_size):
                chunk = [data[j] for j in order[i : i + self.batch_size]]
                ids = [self._ids(t)[0] for t, _ in chunk]
                h, mask = self._hidden(ids, grad=self.train_backbone)
                if self.causal:
                    last = torch.tensor([len(x) - 1 for x in ids], device=self.device)
                    feat = h[torch.arange(len(ids)), last]
                else:
                    feat = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
                p = self._score_hidden(feat).clamp(1e-6, 1 - 1e-6)
                y = torch.tensor([c[1] for c in chunk], dtype=p.dtype, device=self.device)
                loss = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                losses.append(loss.item())
        self.model.eval()
        return float(np.mean(losses))

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.torch.save(self.head.state_dict(), path / "critic_head.pt")
        if self.train_backbone:
            self.model.save_pretrained(path / "backbone")
            self.tok.save_pretrained(path / "backbone")

    def load(self, path: str | Path) -> None:
        path = Path(path)
        self.head.load_state_dict(self.torch.load(path / "critic_head.pt"))
        if (path / "backbone").exists():
            from transformers import AutoModel

            self.model = AutoModel.from_pretrained(path / "backbone").to(self.device).eval()
