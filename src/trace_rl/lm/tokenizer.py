"""A byte-level tokenizer in Hugging Face format, with a ChatML chat template, for the CPU default model.

One token per byte (256) plus the chat specials, so any text round-trips and no vocabulary is learnt. Saved
with `save_pretrained`, it loads with `AutoTokenizer`, so the default model takes the same code path as a hub
model.
"""

from __future__ import annotations

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|im_end|>", bos_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
