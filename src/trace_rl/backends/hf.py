"""Hugging Face transformers backend with prefix-KV sharing, for CPU or GPU.

Design: a call samples one continuation per prompt, in one batch. Each distinct prompt is encoded once (copies
share rows). The longest prefix that all prompts share is prefilled once (or found in a small LRU of prefix
caches from earlier calls) and its KV copied to every row (`DynamicCache.batch_repeat_interleave`). Every
row's KV is also kept after the call, under its token sequence (prompt plus what was fed of its generation),
in a byte-bounded LRU: an episode's next turn, or a continuation forked at an earlier turn, finds the longest
kept sequence its prompt extends, and only the new tokens (the observation) are encoded. Rows whose kept
prefixes differ in length are left-padded into one batch cache, with explicit position ids so every row sees
its true positions. So k continuations of one prefix cost one prefill of that prefix, and a multi-turn episode
costs one encoding of each token it sees. The price: one copy of each row's KV per call (visible only where
generation is nearly free, as with the tiny CPU model), and memory up to `row_cache_bytes`; a vLLM server with
automatic prefix caching does the same with paged memory.

Relies on transformers' `DynamicCache` (crop, batch_repeat_interleave) and on causal LMs accepting a 2-D
attention mask with zeros in the middle plus explicit `position_ids` (true of Llama, Qwen, Mistral). The cache is
passed under the keyword the model's forward reads (`cache` from transformers 5.24, `past_key_values` before:
`lm/kv.py`), and the first cached forward is checked to have used it.
Log-probs are those of the sampled tokens under the temperature-scaled distribution before top-p.

Sampling is per row: row i draws its uniforms from its own seed (numpy, one draw per generated position) and
picks the token by inverse CDF, so a row's tokens do not depend on the other rows of its batch. Caches carry
the weight version (`update_weights()` / `invalidate()` drop them), so no KV of old weights is ever served.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Sequence

import numpy as np

from ..lm.kv import cache_keyword, check_cache_grew
from .base import Generation, SamplingParams, VersionedBackend, row_seeds


class HFBackend(VersionedBackend):
    def __init__(
        self,
        model,
        tokenizer,
        prefix_cache_size: int = 8,
        row_cache_bytes: int = 512 * 2**20,
        compute_dtype: str = "float32",
    ):
        import torch

        from ..lm.precision import check_dtype

        check_dtype("compute_dtype", compute_dtype)
        self.compute_dtype = compute_dtype  # the update's (lm.precision): the log-probs it returns are that dtype's
        self.torch = torch
        self.model, self.tokenizer = model.eval(), tokenizer
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = {tokenizer.eos_token_id}
        self._cache_kw, self._cache_checked = cache_keyword(model), False
        # (weight version, token ids) -> (kv, last logits); a version bump makes every entry unreachable
        self._prefix_cache: OrderedDict[tuple[int, tuple[int, ...]], tuple[object, object]] = OrderedDict()
        self.prefix_cache_size = prefix_cache_size
        # per-sequence KV of earlier calls (prompt + what was fed of its generation), keyed by
        # (version, length, hash), so
        # the next turn of an episode encodes only its new tokens; bounded in bytes, least recently used out
        self._rows: OrderedDict[tuple[int, int, int], tuple[tuple[int, ...], list]] = OrderedDict()
        self._row_lengths: dict[int, int] = {}
        self._row_bytes, self.row_cache_bytes = 0, row_cache_bytes
        self.stats = {"prefill_tokens": 0, "reused_prefix_tokens": 0, "generated_tokens": 0}

    @classmethod
    def load(cls, name: str, device: str = "cpu", dtype: str = "float32", **kwargs) -> "HFBackend":
        from ..lm.models import load_model

        model, tok = load_model(name, device=device, dtype=dtype)
        return cls(model, tok, **kwargs)

    # -- prefix cache -------------------------------------------------------------------------------
    def _prefix_kv(self, shared: list[int]):
        """A DynamicCache holding `shared`, reusing the longest cached prefix; (cache, computed, last logits)."""
        torch = self.torch
        from transformers import DynamicCache

        best, version = (), self.weight_version
        for ver, key in self._prefix_cache:
            if ver == version and len(best) < len(key) <= len(shared) and tuple(shared[: len(key)]) == key:
                best = key
        cache, logits = copy.deepcopy(self._prefix_cache[version, best]) if best else (DynamicCache(), None)
        if best:
            self._prefix_cache.move_to_end((version, best))
        row = self._row_lookup(shared) if len(best) < len(shared) - 1 else None
        if row and row[0] > len(best):  # an earlier call's sequence covers more of it
            best = shared[: row[0]]
            cache, logits = DynamicCache(), None
            for i, (k, v) in enumerate(row[1]):
                cache.update(k, v, i)
        todo = shared[len(best) :]
        if todo:
            ids = torch.tensor([todo], device=self.device)
            pos = torch.arange(len(best), len(shared), device=self.device)[None]
            with torch.no_grad():
                logits = self._forward(ids, cache, position_ids=pos)
        if shared and (version, tuple(shared)) not in self._prefix_cache:
            self._prefix_cache[version, tuple(shared)] = (copy.deepcopy(cache), logits)
            while len(self._prefix_cache) > self.prefix_cache_size:
                self._prefix_cache.popitem(last=False)
        self.stats["prefill_tokens"] += len(todo)
        self.stats["reused_prefix_tokens"] += len(best)
        return cache, len(todo), logits

    def _forward(self, ids, cache, **kwargs):
        """Last-position logits of every row of ids, fed on top of `cache` (which grows in place)."""
        from ..lm.precision import compute_context

        before = cache.get_seq_length()
        with compute_context(self.compute_dtype, self.device):
            out = self.model(input_ids=ids, use_cache=True, **{self._cache_kw: cache}, **kwargs)
        if not self._cache_checked:  # a dropped cache is deterministic: once per backend shows it
            check_cache_grew(self.model, cache, before, ids.shape[1])
            self._cache_checked = True
        return out.logits[:, -1, :]

    def __getstate__(self) -> dict:  # shipped to Ray workers: the weights travel, the caches do not
        state = dict(self.__dict__)
        state.pop("torch")
        state.update(_prefix_cache=OrderedDict(), _rows=OrderedDict(), _row_lengths={}, _row_bytes=0)
        return state

    def __setstate__(self, state: dict) -> None:
        import torch

        self.__dict__.update(state, torch=torch)

    def _load_state_dict(self, state_dict: dict) -> None:
        self.model.load_state_dict(state_dict)

    def clear_cache(self) -> None:
        self._prefix_cache.clear()
        self._rows.clear()
        self._row_lengths.clear()
        self._row_bytes = 0

    # -- per-sequence cache -------------------------------------------------------------------------
    _P = np.uint64(1_000_003)
    _powers = np.ones(1, dtype=np.uint64)  # P^i, grown on demand
    _inverse_powers = np.ones(1, dtype=np.uint64)  # P^-i mod 2^64 (P is odd, so invertible)

    @classmethod
    def _hashes(cls, seq: Sequence[int]) -> np.ndarray:
        """Hash of every prefix of seq, h_i = sum_{j<=i} (t_j + 1) P^(i-j) mod 2^64, vectorised."""
        n = len(seq)
        if len(cls._powers) < n:
            size = max(n, 2 * len(cls._powers))
            inv = np.uint64(pow(int(cls._P), -1, 2**64))
            with np.errstate(over="ignore"):
                cls._powers = np.concatenate([[np.uint64(1)], np.cumprod(np.full(size - 1, cls._P, dtype=np.uint64))])
                cls._inverse_powers = np.concatenate(
                    [[np.uint64(1)], np.cumprod(np.full(size - 1, inv, dtype=np.uint64))]
                )
        with np.errstate(over="ignore"):
            t = np.asarray(seq, dtype=np.uint64) + np.uint64(1)
            return np.cumsum(t * cls._inverse_powers[:n]) * cls._powers[:n]

    def _row_lookup(self, prompt: list[int]):
        """(length, per-layer (K, V)) of the longest stored sequence that is a proper prefix of prompt, or None."""
        hashes = None
        for length in sorted(self._row_lengths, reverse=True):
            if length >= len(prompt):
                continue
            if hashes is None:
                hashes = self._hashes(prompt)
            key = (self.weight_version, length, int(hashes[length - 1]))
            entry = self._rows.get(key)
            if entry is not None and entry[0] == tuple(prompt[:length]):
                self._rows.move_to_end(key)
                return length, entry[1]
        return None

    def _store_rows(self, seqs: list[list[int]], cache, cols: list) -> None:
        """Keep row i's KV (cache columns cols[i], in order) under its token sequence seqs[i]."""
        if not self.row_cache_bytes or not cache.layers:
            return
        for i, (seq, col) in enumerate(zip(seqs, cols)):
            if not seq:
                continue
            key = (self.weight_version, len(seq), int(self._hashes(seq)[-1]))
            if key in self._rows:
                continue
            kv = [(layer.keys[i : i + 1, :, col], layer.values[i : i + 1, :, col]) for layer in cache.layers]
            self._rows[key] = (tuple(seq), kv)
            self._row_lengths[len(seq)] = self._row_lengths.get(len(seq), 0) + 1
            self._row_bytes += self._nbytes(kv)
            while self._row_bytes > self.row_cache_bytes and self._rows:
                (_, length, _), (_, old) = self._rows.popitem(last=False)
                self._row_bytes -= self._nbytes(old)
                self._row_lengths[length] -= 1
                if not self._row_lengths[length]:
                    del self._row_lengths[length]

    @staticmethod
    def _nbytes(kv: list) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)

    # -- sampling -----------------------------------------------------------------------------------
    def _sample(self, logits, params: SamplingParams, uniforms):
        """Next token of every row: greedy, or inverse-CDF with the row's own uniform draw; and its log-prob."""
        torch = self.torch
        logits = logits.float()
        if params.temperature == 0:
            tok = logits.argmax(-1)
            return tok, torch.log_softmax(logits, -1).gather(-1, tok[:, None])[:, 0]
        logp = torch.log_softmax(logits / params.temperature, -1)
        probs = logp.exp()
        if params.top_p < 1.0:
            sp, idx = probs.sort(-1, descending=True)
            drop = sp.cumsum(-1) - sp > params.top_p
            sp = sp.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, idx, sp)
        cdf = probs.cumsum(-1)
        u = torch.as_tensor(uniforms, dtype=cdf.dtype, device=cdf.device)[:, None] * cdf[:, -1:]
        # side="right": a token of zero probability (a flat step of the CDF) is never picked
        tok = torch.searchsorted(cdf, u, right=True)[:, 0].clamp_(max=cdf.shape[-1] - 1)
        return tok, logp.gather(-1, tok[:, None])[:, 0]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        torch = self.torch
        prompts = [list(p) for p in prompts]
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        uniforms = np.stack(
            [np.random.default_rng(s).random(params.max_new_tokens) for s in row_seeds(len(prompts), seed, seeds)]
        )

        B = len(prompts)
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        uniq = [list(p) for p in distinct]
        if len(uniq) == 1:  # k continuations of one prefix: nothing but the prefix to encode
            cache, computed, logits = self._prefix_kv(uniq[0])
            mask = torch.ones((1, len(uniq[0])), dtype=torch.long, device=self.device)
            next_pos = torch.full((1, 1), len(uniq[0]), device=self.device)
        else:
            cache, computed, logits, mask, next_pos = self._encode_distinct(uniq)
        # copies of one prompt (the continuations of one anchor, the bare rollouts of one prompt) share its
        # encoded rows: each distinct prompt is encoded once, then its cache rows are repeated
        idx = torch.tensor(rows, device=self.device)
        if len(uniq) == 1 and B > 1:
            cache.batch_repeat_interleave(B)
        elif 1 < len(uniq) < B:
            cache.batch_select_indices(idx)
        logits, mask, next_pos = logits[idx], mask[idx], next_pos[idx]

        prompt_cols = [mask[i].nonzero()[:, 0] for i in range(B)]
        width0 = mask.shape[1]
        out_ids = [[] for _ in range(B)]
        out_lp = [[] for _ in range(B)]
        reason = ["length"] * B
        done = [False] * B
        with torch.no_grad():
            for step in range(params.max_new_tokens):
                tok, lp = self._sample(logits, params, uniforms[:, step])
                for i in range(B):
                    if done[i]:
                        continue
                    t = int(tok[i])
                    out_ids[i].append(t)
                    out_lp[i].append(float(lp[i]))
                    if t in self.eos_ids or (params.stop and self._hit_stop(out_ids[i], params.stop)):
                        done[i], reason[i] = True, "stop"
                if all(done):
                    break
                tok = tok.masked_fill(torch.tensor(done, device=self.device), self.pad_id)
                mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=self.device)], dim=1)
                logits = self._forward(tok[:, None], cache, attention_mask=mask, position_ids=next_pos)
                next_pos = next_pos + 1
        self.stats["generated_tokens"] += sum(len(o) for o in out_ids)
        # a row's last token is fed to the model unless it ended the row ("stop"): those are its cache columns
        fed = [len(o) - (r == "stop") for o, r in zip(out_ids, reason)]
        self._store_rows(
            [p + o[:f] for p, o, f in zip(prompts, out_ids, fed)],
            cache,
            [torch.cat([c, width0 + torch.arange(f, device=self.device)]) for c, f in zip(prompt_cols, fed)],
        )
        # the call prefilled once for all its rows: counted on its first row, so a sum over rows is the call's
        return [
            Generation(o, l, r, self.tokenizer.decode(o), prefix_tokens_computed=computed if i == 0 else 0)
            for i, (o, l, r) in enumerate(zip(out_ids, out_lp, reason))
        ]

    def _encode_distinct(self, prompts: list[list[int]]):
        """Prefill distinct prompts: their shared prefix once (through the prefix cache), or a row's longer
        sequence from an earlier call, then each row's remaining suffix, left-padded inside the suffix segment
        with explicit positions. Returns (cache, computed, logits, mask, next positions)."""
        torch = self.torch
        first, U = prompts[0], len(prompts)
        lcp = min(len(p) for p in prompts) - 1  # keep one token per row to produce the first logits
        for p in prompts[1:]:
            n = 0
            while n < lcp and p[n] == first[n]:
                n += 1
            lcp = n
        shared, computed, _ = self._prefix_kv(first[:lcp])
        hits = [self._row_lookup(p) for p in prompts]
        hits = [h if h and h[0] > lcp else None for h in hits]
        starts = [h[0] if h else lcp for h in hits]
        if not any(hits):
            cache = shared
            cache.batch_repeat_interleave(U)
            mask = torch.ones((U, lcp), dtype=torch.long, device=self.device)
        else:
            shared_kv = [(layer.keys, layer.values) for layer in shared.layers]
            cache, mask = self._assemble([h[1] if h else shared_kv for h in hits], starts)
            self.stats["reused_prefix_tokens"] += sum(h[0] for h in hits if h)
        suffixes = [p[st:] for p, st in zip(prompts, starts)]
        width = max(len(x) for x in suffixes)
        ids = torch.full((U, width), self.pad_id, dtype=torch.long)
        smask = torch.zeros((U, width), dtype=torch.long)
        for i, x in enumerate(suffixes):
            ids[i, width - len(x) :] = torch.tensor(x)
            smask[i, width - len(x) :] = 1
        start = torch.tensor(starts)[:, None]
        pos = torch.maximum(start + smask.cumsum(-1) - 1, start)
        ids, pos = ids.to(self.device), pos.to(self.device)
        mask = torch.cat([mask, smask.to(self.device)], dim=1)
        computed += sum(len(x) for x in suffixes)
        with torch.no_grad():
            logits = self._forward(ids, cache, attention_mask=mask, position_ids=pos)
        return cache, computed, logits, mask, pos[:, -1:] + 1

    def _assemble(self, sources: list[list], starts: list[int]):
        """One batch cache from per-row (K, V) lists of different lengths, left-padded; (cache, mask)."""
        from transformers import DynamicCache

        torch = self.torch
        width = max(starts)
        ref = next(src for src, st in zip(sources, starts) if st)
        cache = DynamicCache()
        for layer, (k0, v0) in enumerate(ref):
            keys = k0.new_zeros((len(starts), k0.shape[1], width, k0.shape[3]))
            values = v0.new_zeros((len(starts), v0.shape[1], width, v0.shape[3]))
            for i, (src, st) in enumerate(zip(sources, starts)):
                if st:
                    keys[i, :, width - st :] = src[layer][0][0, :, :st]
                    values[i, :, width - st :] = src[layer][1][0, :, :st]
            cache.update(keys, values, layer)
        mask = torch.zeros((len(starts), width), dtype=torch.long, device=self.device)
        for i, st in enumerate(starts):
            mask[i, width - st :] = 1
        return cache, mask

    def _hit_stop(self, ids: list[int], stops: tuple[str, ...]) -> bool:
        tail = self.tokenizer.decode(ids[-16:])
        return any(s in tail for s in stops)
