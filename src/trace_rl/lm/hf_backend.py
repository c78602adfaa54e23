"""Hugging Face transformers backend with prefix-KV sharing, for CPU or GPU.

Design: a call samples one continuation per prompt, in one batch. The longest prefix that all prompts share
is prefilled once (or found in a small LRU of prefix caches from earlier calls), its KV cache is copied B
times (`DynamicCache.batch_repeat_interleave`), and only each distinct prompt's own suffix is encoded (copies of one prompt share
their rows), left-padded inside the suffix segment with explicit position ids so every row sees contiguous
positions. So k continuations of one prefix cost one prefill of that prefix, also when the engine batches them
with other anchors' continuations; a turn of m episodes of one prompt re-encodes only their diverging
histories. What it does not do: keep a per-episode cache across turns (a padded batch
cache cannot be split back into plain prefixes); a vLLM server with automatic prefix caching does that.

Relies on transformers' `DynamicCache` (crop, batch_repeat_interleave) and on causal LMs accepting a 2-D
attention mask with zeros in the middle plus explicit `position_ids` (true of Llama, Qwen, Mistral).
Log-probs are those of the sampled tokens under the temperature-scaled distribution before top-p.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Sequence

from .backend import Generation, SamplingParams


class HFBackend:
    def __init__(self, model, tokenizer, prefix_cache_size: int = 8):
        import torch

        self.torch = torch
        self.model, self.tokenizer = model.eval(), tokenizer
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = {tokenizer.eos_token_id}
        self._prefix_cache: OrderedDict[tuple[int, ...], tuple[object, object]] = OrderedDict()  # -> (kv, last logits)
        self.prefix_cache_size = prefix_cache_size
        self.stats = {"prefill_tokens": 0, "reused_prefix_tokens": 0, "generated_tokens": 0}

    @classmethod
    def load(cls, name: str, device: str = "cpu", dtype: str = "float32", **kwargs) -> "HFBackend":
        from .models import load_model

        model, tok = load_model(name, device=device, dtype=dtype)
        return cls(model, tok, **kwargs)

    # -- prefix cache -------------------------------------------------------------------------------
    def _prefix_kv(self, shared: list[int]):
        """A DynamicCache holding `shared`, reusing the longest cached prefix; (cache, computed, last logits)."""
        torch = self.torch
        from transformers import DynamicCache

        best = ()
        for key in self._prefix_cache:
            if len(best) < len(key) <= len(shared) and tuple(shared[: len(key)]) == key:
                best = key
        cache, logits = copy.deepcopy(self._prefix_cache[best]) if best else (DynamicCache(), None)
        if best:
            self._prefix_cache.move_to_end(best)
        todo = shared[len(best):]
        if todo:
            ids = torch.tensor([todo], device=self.device)
            pos = torch.arange(len(best), len(shared), device=self.device)[None]
            with torch.no_grad():
                logits = self.model(input_ids=ids, cache=cache, position_ids=pos, use_cache=True).logits[:, -1, :]
        if shared and tuple(shared) not in self._prefix_cache:
            self._prefix_cache[tuple(shared)] = (copy.deepcopy(cache), logits)
            while len(self._prefix_cache) > self.prefix_cache_size:
                self._prefix_cache.popitem(last=False)
        self.stats["prefill_tokens"] += len(todo)
        self.stats["reused_prefix_tokens"] += len(best)
        return cache, len(todo), logits

    def clear_cache(self) -> None:
        self._prefix_cache.clear()

    # -- sampling -----------------------------------------------------------------------------------
    def _sample(self, logits, params: SamplingParams, gen):
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
        tok = torch.multinomial(probs / probs.sum(-1, keepdim=True), 1, generator=gen)[:, 0]
        return tok, logp.gather(-1, tok[:, None])[:, 0]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int | None = None) -> list[Generation]:
        torch = self.torch
        prompts = [list(p) for p in prompts]
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        gen = torch.Generator(device=self.device)
        gen.manual_seed(0 if seed is None else int(seed))

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

        out_ids = [[] for _ in range(B)]
        out_lp = [[] for _ in range(B)]
        reason = ["length"] * B
        done = [False] * B
        with torch.no_grad():
            for _ in range(params.max_new_tokens):
                tok, lp = self._sample(logits, params, gen)
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
                logits = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos,
                                    cache=cache, use_cache=True).logits[:, -1, :]
                next_pos = next_pos + 1
        self.stats["generated_tokens"] += sum(len(o) for o in out_ids)
        return [
            Generation(o, l, r, self.tokenizer.decode(o), prefix_tokens_computed=computed)
            for o, l, r in zip(out_ids, out_lp, reason)
        ]

    def _encode_distinct(self, prompts: list[list[int]]):
        """Prefill distinct prompts: their shared prefix once (through the prefix cache), then each suffix,
        left-padded inside the suffix segment with explicit positions. (cache, computed, logits, mask, pos)."""
        torch = self.torch
        first, U = prompts[0], len(prompts)
        lcp = min(len(p) for p in prompts) - 1  # keep one token per row to produce the first logits
        for p in prompts[1:]:
            n = 0
            while n < lcp and p[n] == first[n]:
                n += 1
            lcp = n
        cache, computed, _ = self._prefix_kv(first[:lcp])
        cache.batch_repeat_interleave(U)
        suffixes = [p[lcp:] for p in prompts]
        width = max(len(s) for s in suffixes)
        ids = torch.full((U, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((U, lcp + width), dtype=torch.long)
        mask[:, :lcp] = 1
        for i, s in enumerate(suffixes):
            ids[i, width - len(s):] = torch.tensor(s)
            mask[i, lcp + width - len(s):] = 1
        pos = (lcp + mask[:, lcp:].cumsum(-1) - 1).clamp(min=lcp)
        ids, mask, pos = ids.to(self.device), mask.to(self.device), pos.to(self.device)
        computed += sum(len(s) for s in suffixes)
        with torch.no_grad():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True).logits[:, -1, :]
        return cache, computed, logits, mask, pos[:, -1:] + 1

    def _hit_stop(self, ids: list[int], stops: tuple[str, ...]) -> bool:
        tail = self.tokenizer.decode(ids[-16:])
        return any(s in tail for s in stops)
