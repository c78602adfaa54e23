"""Small tokenizers in Hugging Face format, with a ChatML chat template, for CPU models built from a config.

- `byte_tokenizer`: one token per byte plus the chat specials; any text round-trips. Used by tests.
- `word_tokenizer`: the CPU default's. The words of the built-in task's prompts are one token each and every
  other printable ASCII character, each digit included, is its own token (anything else becomes <unk>).
  Episodes are about three times shorter than in bytes. Digits stay single tokens on purpose: an earlier
  version made every number up to 9999 one token, and a tiny model then had to learn to copy each of 10,000
  rare tokens separately, which it did not manage beyond the shortest chains. With ten digit tokens it learns
  one copying circuit for all numbers, and each token is cheaper (148 output rows instead of 11,248).
Saved with `save_pretrained`, both load with `AutoTokenizer`, so the default model takes a hub model's path.
"""

from __future__ import annotations

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
TASK_WORDS = (
    "Compute left right to Action calc answer Observation Next Tools expression number One per step Example "
    "Correct Wrong Invalid action format Write or Unknown tool Available Error Turn limit reached system user "
    "assistant only integers with and parentheses are allowed not an arithmetic"
).split()


def byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return _chat_tokenizer(tok)


def word_tokenizer(words: tuple[str, ...] | list[str] = TASK_WORDS):
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIALS + ["<unk>"])}
    for item in list(string.printable) + list(words):
        vocab.setdefault(item, len(vocab))
    pattern = "|".join(sorted(set(words), key=len, reverse=True)) + r"|."
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return _chat_tokenizer(tok, unk_token="<unk>")


def _chat_tokenizer(tok, **special: str):
    """`tok` in Hugging Face form with the ChatML specials and template both tokenizers share."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
        **special,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
