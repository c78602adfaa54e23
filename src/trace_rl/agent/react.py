"""The ReAct agent loop, token-in/token-out: an episode's history is a list of token ids extended turn by turn.

The prompt is rendered once with the model's chat template. Each turn appends the sampled assistant tokens
(loss mask 1, with their sampling log-probs) and then the observation segment (loss mask 0): the template's
glue between an assistant message and the next user message, with the observation inside, tokenised on its
own. The whole history is never re-tokenised, so the ids a trainer sees are the ids the policy sampled.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from ..envs.base import AgentEnv
from ..errors import UserError

_PLACEHOLDER = "\x00OBS\x00"


class ChatFormat:
    """Pieces of a tokenizer's chat template: prompt ids and the observation segment around an observation."""

    def __init__(self, tokenizer, observation_prefix: str = "Observation: "):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; the ReAct agent needs one")
        self.tok = tokenizer
        self.observation_prefix = observation_prefix
        base = [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"},
        ]
        one = self._render(base, False)
        two = self._render(base + [{"role": "user", "content": _PLACEHOLDER}], True)
        if not two.startswith(one) or _PLACEHOLDER not in two:
            raise ValueError("cannot split the chat template into turns (it rewrites earlier messages)")
        after_assistant = one[one.rindex("A") + 1 :]
        eos = tokenizer.eos_token or ""
        glue = after_assistant[len(eos) :] if eos and after_assistant.startswith(eos) else after_assistant
        head, tail = (glue + two[len(one) :]).split(_PLACEHOLDER)
        self.obs_head, self.obs_tail = head, tail

    def _render(self, messages, gen: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)

    def prompt_ids(self, system: str, user: str) -> list[int]:
        text = self._render([{"role": "system", "content": system}, {"role": "user", "content": user}], True)
        return self.tok(text, add_special_tokens=False).input_ids

    def observation_ids(self, observation: str, closed: bool) -> list[int]:
        """Ids to append after an assistant turn; `closed` says the turn already ended with the eos token."""
        text = (
            ("" if closed else self.tok.eos_token or "")
            + self.obs_head
            + self.observation_prefix
            + observation
            + self.obs_tail
        )
        return self.tok(text, add_special_tokens=False).input_ids


@dataclass
class Turn:
    thought: str
    action: str
    observation: str
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float | None
    done: bool


@dataclass
class Episode:
    """One agent trajectory in flight: its environment and the token history so far."""

    env: AgentEnv
    token_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    reward: float = 0.0
    seed: int = 0  # the episode's random stream: turn t samples with derive_seed(seed, t)
    key: str = ""  # the tree it belongs to: backends that route requests keep a tree on one engine
    task: str = ""  # the task, as an error names it (`task_label`)

    def fork(self) -> "Episode":
        return Episode(
            self.env.fork(),
            list(self.token_ids),
            list(self.turns),
            self.done,
            self.reward,
            self.seed,
            self.key,
            self.task,
        )


class NonFiniteReward(UserError):
    """An environment ended an episode with a reward that is not a finite number (NaN, inf, not a number): one
    line naming the environment and the task, and the step once the run loop or the evaluation adds it (`at`)."""

    def __init__(self, message: str, where: str = ""):
        super().__init__(f"{message} ({where})" if where else message)
        self.message, self.where = message, where

    def at(self, where: str) -> NonFiniteReward:
        """The same error saying where in the run it came (kept when a caller nearer the source said it)."""
        return self if self.where else NonFiniteReward(self.message, where)


def task_label(task) -> str:
    """A short name for a task: its index or id when it has one, else the start of its question."""
    if isinstance(task, dict):
        for key in ("index", "id", "task_id"):
            if isinstance(task.get(key), (int, str)) and not isinstance(task.get(key), bool):
                return f"{key} {str(task[key])[:60]}"
        text = task.get("question", task.get("prompt", ""))
        if isinstance(text, str) and text:
            return repr(" ".join(text.split())[:60])
    return repr(str(task)[:60])


def start_episode(env: AgentEnv, task: dict, fmt: ChatFormat) -> Episode:
    question = env.reset(task)
    return Episode(env, fmt.prompt_ids(env.system_prompt(), question), task=task_label(task))


def _check_reward(ep: Episode, reward) -> float:
    """A final reward as a float; `NonFiniteReward` (one line) for NaN, inf or a non-number, never scored."""
    if isinstance(reward, numbers.Real) and math.isfinite(float(reward)):
        return float(reward)
    env = getattr(ep.env, "name", None) or type(ep.env).__name__
    raise NonFiniteReward(
        f"env {env}: task {ep.task} ended with the reward {reward!r}; an environment's rewards are finite numbers"
    )


def apply_generation(ep: Episode, gen, fmt: ChatFormat) -> Turn:
    """Feed one sampled assistant turn to the environment and extend the episode's history."""
    text = fmt.tok.decode(gen.token_ids, skip_special_tokens=True)
    obs, reward, done, info = ep.env.step(text)
    if done:
        reward = _check_reward(ep, reward)
    closed = bool(gen.token_ids) and gen.token_ids[-1] == fmt.tok.eos_token_id
    thought, _, action = text.partition("Action:")
    obs_ids = [] if done else fmt.observation_ids(obs, closed)
    turn = Turn(
        thought=thought.replace("Thought:", "").strip(),
        action=("Action:" + action).strip() if action else text.strip(),
        observation=obs,
        token_ids=list(gen.token_ids) + obs_ids,
        loss_mask=[1] * len(gen.token_ids) + [0] * len(obs_ids),
        logprobs=list(gen.logprobs),
        reward=reward if done else None,
        done=done,
    )
    ep.token_ids.extend(turn.token_ids)
    ep.turns.append(turn)
    ep.done, ep.reward = done, (reward if done else 0.0)
    return turn
