"""Warm start by supervised training on the built-in task's scripted demonstrations.

Demonstrations are token sequences built exactly as the agent builds histories (prompt ids, then each
assistant turn plus eos with loss mask 1, then the observation segment with mask 0), so SFT and RL see the
same ids. The learning rate follows the step count (linear warm-up, then linear decay to 35%), so a seed
reproduces the model exactly. A wall-clock cap is off by default; a run that a user-set cap cuts short is
reported as such and never replaces the cached default. Progress is logged.

Why decay to 35% and not further: the final learning rate sets how strong the warm-started policy is, and so
how many prompts of the RL mix sit between always and never solved. A policy decayed further is weaker on the
longer chains and larger numbers and leaves more prompts in between, where uniform sampling already finds
contrast and TRACE has less to add; 35% keeps the mix of near-certain, mixed and hopeless prompts that real RL
data shows. docs/lm_agents.md records what each choice measured.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..agent.react import ChatFormat
from ..envs.calculator import CalculatorEnv, solve
from ..errors import ConfigError
from ..stack.config import EngineConfig, LMEnvConfig, LMPolicyConfig, check_seed


def demo_sequence(task: dict, fmt: ChatFormat) -> tuple[list[int], list[int]]:
    env = CalculatorEnv()
    ids = fmt.prompt_ids(env.system_prompt(), env.reset(task))
    mask = [0] * len(ids)
    for text in solve(task):
        act = fmt.tok(text + fmt.tok.eos_token, add_special_tokens=False).input_ids
        ids += act
        mask += [1] * len(act)
        obs, _, done, _ = env.step(text)
        if not done:
            seg = fmt.observation_ids(obs, closed=True)
            ids += seg
            mask += [0] * len(seg)
    return ids, mask


@dataclass
class SFTParams:
    """Supervised warm start on scripted demonstrations (the `sft` group)."""

    lr: float = 1e-3  # AdamW peak learning rate
    batch_size: int = 8  # demonstrations per step
    warmup_steps: int = 20  # linear warm-up of the learning rate
    final_lr: float = 0.35  # the learning rate decays linearly to this share of lr at the last step
    tasks: int = 20_000  # demonstrations to draw from
    eval_tasks: int = 512  # held-out tasks of the RL mix to report success on
    max_minutes: float = 0.0  # wall-clock cap (0: none); a run it cuts short is not cached as the default

    def __post_init__(self):
        if not self.lr > 0 or not 0 <= self.final_lr <= 1:
            raise ValueError(f"lr must be > 0 and final_lr in [0, 1], got {self.lr}, {self.final_lr}")
        for name in ("batch_size", "tasks", "eval_tasks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {self.warmup_steps}")
        if not 0 <= self.max_minutes < float("inf"):
            raise ValueError(f"max_minutes must be >= 0 (0: no cap), got {self.max_minutes}")


def train_sft(
    model,
    tokenizer,
    tasks: list[dict],
    max_steps: int = 1500,
    params: SFTParams | None = None,
    seed: int = 0,
    log_every: int = 20,
) -> dict:
    """AdamW on masked next-token loss, linear warm-up then linear decay to `final_lr` x lr at max_steps;
    returns steps, tokens, seconds, loss and whether a wall-clock cap stopped it early."""
    import torch

    params = params or SFTParams()
    lr, batch_size, warmup_steps, final_lr = params.lr, params.batch_size, params.warmup_steps, params.final_lr
    max_seconds = params.max_minutes * 60 if params.max_minutes else float("inf")

    torch.manual_seed(seed)
    fmt = ChatFormat(tokenizer)
    seqs = [demo_sequence(t, fmt) for t in tasks]
    pad = tokenizer.pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    start, tokens, step, loss_ema = time.perf_counter(), 0, 0, None
    g = torch.Generator().manual_seed(seed)
    while step < max_steps and time.perf_counter() - start < max_seconds:
        idx = torch.randint(len(seqs), (batch_size,), generator=g).tolist()
        width = max(len(seqs[i][0]) for i in idx)
        ids = torch.full((batch_size, width), pad)
        labels = torch.full((batch_size, width), -100)
        attn = torch.zeros((batch_size, width), dtype=torch.long)
        for r, i in enumerate(idx):
            s, m = seqs[i]
            ids[r, : len(s)] = torch.tensor(s)
            attn[r, : len(s)] = 1
            labels[r, : len(s)] = torch.where(torch.tensor(m) == 1, torch.tensor(s), torch.tensor(-100))
        frac = (1.0 - final_lr) * step / max_steps  # by steps only, so one seed gives one model on any machine
        for group in opt.param_groups:
            group["lr"] = lr * min((step + 1) / warmup_steps, 1.0 - frac)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += int(attn.sum())
        loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
        if log_every and step % log_every == 0:  # printing only: no number here feeds the training
            from ..rollout.run_loop import duration, time_left

            el = time.perf_counter() - start
            left = time_left(el, step, max_steps)
            print(
                f"\rsft step {step}/{max_steps}  loss {loss_ema:.3f}  {tokens / el:,.0f} tok/s  {duration(el)} so far"
                + (f", {left}" if left else ""),
                end="",
                file=sys.stderr,
                flush=True,
            )
    if log_every:
        print(file=sys.stderr)
    model.eval()
    return {
        "steps": step,
        "tokens": tokens,
        "seconds": time.perf_counter() - start,
        "loss": loss_ema,
        "stopped_early": step < max_steps,
    }


@dataclass
class SFTConfig:
    """`trace-rl sft`: warm-start a policy on the built-in task's scripted demonstrations and cache it."""

    out: str = ""  # where to save (default: the cache entry where model=tiny@SEED finds it; tiny is tiny@0)
    seed: int = 0  # one seed, one model per library versions and numerics (lm/warm_start.py)
    steps: int = 1500  # optimizer steps (tiny model: about 6 minutes on one core, portable)
    sft: SFTParams = field(default_factory=SFTParams)
    policy: LMPolicyConfig = field(default_factory=LMPolicyConfig)  # model: 'tiny' trains a fresh tiny model

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        check_seed(self.seed)
        if self.policy.backend != "hf":
            raise ValueError(f"policy.backend: sft trains and reports in this process (hf), got {self.policy.backend}")


def _settings(cfg: SFTConfig) -> dict | None:
    """The SFT settings that differ from the defaults (None: the defaults; the wall-clock cap changes none)."""

    def weights_settings(steps: int, params: SFTParams) -> dict:
        return {"steps": steps, "sft": {k: v for k, v in asdict(params).items() if k != "max_minutes"}}

    own = weights_settings(cfg.steps, cfg.sft)
    return None if own == weights_settings(SFTConfig.__dataclass_fields__["steps"].default, SFTParams()) else own


def run_sft(cfg: SFTConfig, yaml_text: str = "") -> Path:
    """Train, save the model and tokenizer, report held-out success by difficulty, write the report's episodes
    as trees (a predictor warm start). The tiny model's warm start goes to its cache entry (`lm.warm_start`: keyed
    by seed, code and library versions, built under a lock, renamed into place with its manifest); an entry that
    is already built is reused, not trained again. A run cut short by a wall-clock cap is saved beside it."""
    import shutil

    from ..lm import warm_start
    from ..lm.models import RANDOM_TINY, cache_dir

    name = cfg.policy.model
    tiny = name == RANDOM_TINY or warm_start.is_tiny(name)
    if name.startswith("tiny@") and warm_start.parse_tiny(name) != cfg.seed:  # plain tiny trains from `seed`
        raise ConfigError(f"policy.model: sft trains {name} from its own seed; pass seed={warm_start.parse_tiny(name)}")
    if cfg.out:
        return _train_and_save(cfg, Path(cfg.out), yaml_text)
    if not tiny:
        return _train_and_save(cfg, cache_dir() / (Path(name).name + "-sft"), yaml_text)
    settings = _settings(cfg)
    entry = warm_start.entry_dir(cfg.seed, settings)
    with warm_start.file_lock(entry):
        if warm_start.read_manifest(entry):
            print(f"warm start {entry.name} is already built (same seed, code and library versions): {entry}")
            _say_shipped(cfg.seed, entry)
            return entry
        tmp = entry.with_name(f".{entry.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        made = _build_entry(cfg, tmp, yaml_text, warm_start.basis(cfg.seed, settings))
        if made != tmp:  # cut short by the wall-clock cap: kept beside the cache, never as the entry
            partial = entry.with_name(entry.name + "-partial")
            shutil.rmtree(partial, ignore_errors=True)
            made.rename(partial)
            print(f"saved to {partial}, not as the cached warm start", file=sys.stderr)
            return partial
        shutil.rmtree(entry, ignore_errors=True)  # an unfinished entry (no manifest) from a killed build
        tmp.rename(entry)
    print(f"warm start {entry.name}: {entry}")
    _say_shipped(cfg.seed, entry)
    return entry


def _say_shipped(seed: int, entry: Path) -> None:
    """Whether a built warm start is the shipped one, bit for bit (`warm_start.shipped_verdict`)."""
    from ..lm import warm_start

    line = warm_start.shipped_verdict(seed, (warm_start.read_manifest(entry) or {}).get("weights_digest", ""))
    if line:
        print(line)


def _build_entry(cfg: SFTConfig, out: Path, yaml_text: str, manifest: dict) -> Path:
    """Train a cache entry with the numerics its key names: portable ones in a fresh process
    (`warm_start.run_portable`), native ones here."""
    from ..lm import warm_start

    if manifest["numerics"] != warm_start.PORTABLE:
        return _train_and_save(cfg, out, yaml_text, manifest)
    print("building with portable numerics (one thread, MKL's and ATen's AVX2 code paths: lm/warm_start.py)")
    return warm_start.run_portable("trace_rl.train.sft:_train_portable", cfg, out, yaml_text, manifest)


def _train_portable(cfg: SFTConfig, out: Path, yaml_text: str, manifest: dict) -> Path:
    """`_train_and_save` in the process `_build_entry` starts, on one thread, after checking that the pins took."""
    import os

    import torch

    from ..lm import warm_start

    torch.set_num_threads(1)
    pins = {k: os.environ.get(k) for k in warm_start.PORTABLE_ENV}
    aten, mkl = torch.backends.cpu.get_cpu_capability(), torch.backends.mkl.is_available()
    if pins != warm_start.PORTABLE_ENV or aten != "AVX2" or not mkl:
        raise RuntimeError(
            f"portable numerics did not take: environment {pins}, ATen {aten}, MKL {'present' if mkl else 'absent'}"
        )
    return _train_and_save(cfg, out, yaml_text, manifest)


def _train_and_save(cfg: SFTConfig, out: Path, yaml_text: str, manifest: dict | None = None) -> Path:
    """Train and report; returns where the model went (`out`, or `out`-partial when the cap cut it short). With
    `manifest` (the warm start's basis), writes warm_start.json: the basis, its key, the weights digest, the
    report, the thread count and the processor, last, so an entry with a manifest is a finished one."""
    import json
    import platform

    import torch

    from ..envs.calculator import DEMO_MIX, make_tasks
    from ..lm import warm_start
    from ..lm.models import DEFAULT_MODEL, RANDOM_TINY, create_tiny_model, load_model
    from ..rollout.evaluate import success_by_group
    from ..seeding import derive_seed
    from ..stack.build import build_actor, build_env, build_policy
    from ..tree import save_trees

    name = cfg.policy.model
    if name in (DEFAULT_MODEL, RANDOM_TINY) or warm_start.is_tiny(name):
        model, tok = create_tiny_model(seed=cfg.seed)
    else:
        model, tok = load_model(name, device=cfg.policy.device)
    print(f"model: {name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters) -> {out}")
    tasks = make_tasks(cfg.sft.tasks, seed=derive_seed(cfg.seed, "sft-demos"), **DEMO_MIX)
    stats = train_sft(model, tok, tasks, max_steps=cfg.steps, params=cfg.sft, seed=cfg.seed)
    if stats["stopped_early"]:
        print(
            f"stopped early by sft.max_minutes={cfg.sft.max_minutes} after {stats['steps']} of {cfg.steps} steps: "
            "not reproducible from the seed",
            file=sys.stderr,
        )
        if manifest is not None or not cfg.out:  # never let a cut-short run become a cached warm start
            out = out.with_name(out.name + "-partial")
            manifest = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    if yaml_text:
        (out / "config.yaml").write_text(yaml_text)
    print(
        f"trained {stats['steps']} steps, {stats['tokens']:,} tokens in {stats['seconds']:.0f}s "
        f"({stats['tokens'] / max(stats['seconds'], 1e-9):,.0f} tok/s), final loss {stats['loss']:.3f}"
    )
    # the report is on the env's default mix, the RL mix (1-5 steps, 1-3 digits): wider than the demonstrations'
    # DEMO_MIX (1-4 steps, 1-2 digits), so it shows how far the warm start reaches past what it was shown
    spec = build_env(LMEnvConfig())
    params = cfg.policy.sampling(spec.max_new_tokens)
    actor = build_actor(build_policy(cfg.policy, model=model, tokenizer=tok), spec, params, EngineConfig())
    report, trees = success_by_group(
        actor, spec.held_out(cfg.sft.eval_tasks, derive_seed(cfg.seed, "sft-eval")), spec.group, seed=cfg.seed
    )
    print(f"success on {cfg.sft.eval_tasks} held-out tasks at temperature {params.temperature}:")
    for key, val in report.items():
        print(f"  {key:<20} {val:.3f}")
    (out / "sft_report.json").write_text(json.dumps({"train": stats, "eval": report}, indent=2))
    save_trees(out / "sft_eval_trees.jsonl", trees)
    print(
        f"wrote {out}/sft_report.json and the report's episodes as trees, sft_eval_trees.jsonl "
        "(predictor.warmup of trace-rl rollout)"
    )
    if manifest is not None:
        record = {
            "key": warm_start.key_of(manifest),
            **manifest,
            "weights_digest": warm_start.weights_digest(out),
            "report": report,
            "train": stats,
            "threads": torch.get_num_threads(),
            "processor": {
                "machine": platform.machine(),
                "torch_cpu": torch.backends.cpu.get_cpu_capability(),
                **dict(zip(("vendor", "model"), warm_start.cpu_info()[:2])),
                "libc": "-".join(platform.libc_ver()),
            },
        }
        (out / warm_start.MANIFEST).write_text(json.dumps(record, indent=2))
        print(f"weights digest {record['weights_digest']}, key {record['key']}")
    return out
