"""The tokenizer a GGUF file describes, built as `tokenizer.json` text for the Rust core's
`Tokenizer` (which encodes, decodes and detokenizes; no `transformers` needed at run time).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from rsgl.errors import UnsupportedModelError

# llama.cpp's token types (gguf.TokenType).
_CONTROL = 3
_USER_DEFINED = 4

_SENTENCEPIECE_SPACE = "\u2581"  # "▁"

# How text is split before byte-level BPE, by `tokenizer.ggml.pre` (llama.cpp's llama-vocab.cpp).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5's: Qwen2's with combining marks (\p{M}) in the runs of letters.
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_REGEX_BY_PRE = {
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "qwen35": _QWEN35_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# These split every digit apart, then apply GPT-2's pattern.
_DIGITS_THEN_GPT2_PRE = {"smollm", "starcoder"}


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table spelling each byte as a printable character (byte-level BPE vocabularies use it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


# ---------------------------------------------------------------------------------------------
# Building a tokenizer from a GGUF vocabulary
# ---------------------------------------------------------------------------------------------


@dataclass
class GgufVocabulary:
    """The `tokenizer.ggml.*` metadata of a GGUF file."""

    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    pre: str | None  # pre-tokenizer name, for "gpt2"
    tokens: list[str]
    token_types: list[int]
    merges: list[str] | None
    scores: list[float] | None
    special_ids: set[int]  # bos / eos / unk / pad ids, special even when not typed CONTROL
    unknown_id: int | None
    add_space_prefix: bool  # SentencePiece: prepend "▁" to the text


def tokenizer_json_from_gguf(vocabulary: GgufVocabulary) -> str:
    """The tokenizer a GGUF file describes, as llama.cpp (and transformers' GGUF loader) builds
    it, as `tokenizer.json` text."""
    if vocabulary.model == "gpt2":
        tokenizer = _byte_level_bpe(vocabulary)
    elif vocabulary.model == "llama":
        tokenizer = _sentencepiece_bpe(vocabulary)
    else:
        raise UnsupportedModelError(
            f"this GGUF file's tokenizer is of type {vocabulary.model!r}; rsgl supports 'gpt2' (byte-level BPE) "
            "and 'llama' (SentencePiece BPE). Use another model, or load it with skip_tokenizer_init=True."
        )
    _add_gguf_added_tokens(tokenizer, vocabulary)
    return tokenizer.to_str()


def _byte_level_bpe(vocabulary: GgufVocabulary) -> Tokenizer:
    if vocabulary.merges is None:
        raise UnsupportedModelError("this byte-level BPE GGUF file has no tokenizer.ggml.merges; it looks broken.")
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # A few files store a token as plain text (e.g. with a real space): respell it in the byte alphabet.
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[byte] for byte in token.encode("utf-8")): index for index, token in enumerate(vocabulary.tokens)
    }
    merges = [_merge_pair(merge) for merge in vocabulary.merges]
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    tokenizer.pre_tokenizer = _byte_level_pre_tokenizer(vocabulary.pre)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _merge_pair(merge: str) -> tuple[str, str]:
    left, right = merge.split(" ", 1)
    return left, right


def _byte_level_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    split = _SPLIT_REGEX_BY_PRE.get(pre or "")
    if split is not None:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    return gpt2  # "default", "gpt-2" and names we do not know: GPT-2's own pattern


def _sentencepiece_bpe(vocabulary: GgufVocabulary) -> Tokenizer:
    if vocabulary.merges is not None:
        merges = [_merge_pair(merge) for merge in vocabulary.merges]
    elif vocabulary.scores is not None:
        merges = _merges_from_scores(vocabulary.tokens, vocabulary.scores)
    else:
        raise UnsupportedModelError("this SentencePiece GGUF file has neither merges nor scores; it looks broken.")
    unknown = vocabulary.tokens[vocabulary.unknown_id] if vocabulary.unknown_id is not None else None
    vocab = {token: index for index, token in enumerate(vocabulary.tokens)}
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token=unknown, fuse_unk=True, byte_fallback=True))
    prepend = "first" if vocabulary.add_space_prefix else "never"
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SENTENCEPIECE_SPACE, prepend_scheme=prepend, split=False)
    steps = [decoders.Replace(_SENTENCEPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if vocabulary.add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))  # drop the space the pre-tokenizer prepended
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece files list no merges: every token that splits into two known tokens is one,
    ranked by the token's score (best first), as llama.cpp and transformers do it."""
    index = {token: position for position, token in enumerate(tokens)}
    ranked: list[tuple[str, str, float]] = []
    for token, score in dict(zip(tokens, scores)).items():
        pairs = [(token[:cut], token[cut:]) for cut in range(1, len(token))]
        known = sorted(
            ((left, right) for left, right in pairs if left in index and right in index),
            key=lambda pair: (index[pair[0]], index[pair[1]]),
        )
        ranked.extend((left, right, score) for left, right in known)
    ranked.sort(key=lambda merge: (merge[2], len(merge[0]), len(merge[1])), reverse=True)
    return [(left, right) for left, right, _ in ranked]


def _add_gguf_added_tokens(tokenizer: Tokenizer, vocabulary: GgufVocabulary) -> None:
    """Match control / user-defined tokens whole in text, as llama.cpp does, instead of cutting them up."""
    special, plain = [], []
    for index, (token, token_type) in enumerate(zip(vocabulary.tokens, vocabulary.token_types)):
        # A token the model vocabulary spells differently would get a new id: leave those alone.
        if tokenizer.token_to_id(token) != index:
            continue
        if token_type == _CONTROL or index in vocabulary.special_ids:
            special.append(AddedToken(token, special=True, normalized=False))
        elif token_type == _USER_DEFINED:
            plain.append(AddedToken(token, special=False, normalized=False))
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(plain)
