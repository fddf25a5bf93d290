#!/usr/bin/env python3
"""Writes tokenizer_cases.json: what Hugging Face's BertTokenizer (transformers 5, the Rust
`tokenizers` pipeline; the tokenizer sentence-transformers uses) gives on a corpus, for
tests/test_bert.cpp to compare kiln's BertTokenizer with, token for token.

    python3 tests/data/bert/make_tokenizer_fixture.py tests/data/bert/vocab.txt > tests/data/bert/tokenizer_cases.json

vocab.txt is bert-base-uncased's (the one all-MiniLM-L6-v2 ships). Needs: pip install transformers.
"""
import json
import sys

import transformers
from transformers import BertTokenizer

CORPUS = [
    "Here is some text to encode",
    "",
    "   ",
    "Hello, world!",
    "HELLO World... What's up?!",
    "The quick brown fox jumps over the lazy dog.",
    "Numbers: 3.14159, 42, -7, 1,000,000 and 2nd/3rd.",
    "e-mail: someone@example.com; URL: https://example.org/a?b=c&d=e#f",
    "Café déjà vu, naïve façade, Ångström, crème brûlée.",
    "Ünïcödé àccênts: ÀÉÎÕÜ ñ Ç ß ø æ œ",
    "İstanbul ΟΔΟΣ Ελληνικά Русский текст",
    "我爱自然语言处理。今天天气很好！",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다",
    "Mixed 中文 and English 文本 together",
    "emoji 😀 🚀 are unknown 🎉",
    "tabs\tand\nnewlines\r\nand  double  spaces",
    "zero\u200bwidth\u00adsoft\ufeffhyphen and \u2028 line separator \u00a0 nbsp",
    "control\x01\x02chars\x7f and private \ue000 use",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "a" * 120,
    "x" * 99 + " " + "y" * 101,
    "[CLS] special [SEP] tokens [MASK] in [PAD] text [UNK] and [sep] lower",
    "don't won't can't I'm you're it's we've",
    "(parentheses) [brackets] {braces} <angles> \"quotes\" 'single'",
    "¿Dónde está? ¡Aquí! «quotes» „low“ — dash – en … ellipsis",
    "$100 + 50% = €150 ± 5 × 2 ÷ 3 ≠ 7 © ® ™ § ¶",
    "ﬁne ligatures ǅ titlecase ａｂｃ fullwidth",
    "e\u0301 combining acute, n\u0303 tilde",
    "unaffable unbelievable reinvention",
    "COVID-19 vaccine BERT-base GPT-4o",
    "The Eiffel Tower is in Paris, France.",
    "A man is playing a guitar.",
]

PAIRS = [
    ("How old are you?", "I am six years old."),
    ("Here is some text to encode", ""),
    ("short", "a considerably longer second sentence with many words in it"),
    ("one two three four five six seven eight nine ten eleven twelve", "alpha beta"),
]


def main():
    tok = BertTokenizer(sys.argv[1], do_lower_case=True)
    cases = {"transformers": transformers.__version__, "tokenizer": type(tok).__name__, "single": [], "pair": [],
             "batches": [], "decode": []}
    for text in CORPUS:
        cases["single"].append({"text": text, "tokens": tok.tokenize(text), "ids": tok(text)["input_ids"]})
    for a, b in PAIRS:
        # as a batch of one: tok(a, "") alone would drop the empty pair (Python's truthiness), a batch keeps it
        enc = tok([a], [b])
        cases["pair"].append({"text": a, "pair": b, "ids": enc["input_ids"][0], "token_type_ids": enc["token_type_ids"][0]})
    # batches: padding to the longest and to max_length, truncation of singles and pairs
    texts = CORPUS[:12]
    for max_length in (8, 16):
        enc = tok(texts, padding="max_length", truncation=True, max_length=max_length)
        cases["batches"].append({"texts": texts, "padding": "max_length", "truncation": True, "max_length": max_length,
                                 **{k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}})
    enc = tok(texts, padding="longest", truncation=True, max_length=512)
    cases["batches"].append({"texts": texts, "padding": "longest", "truncation": True, "max_length": 512,
                             **{k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}})
    a = [p[0] for p in PAIRS] * 2
    b = [p[1] for p in PAIRS] * 2
    for max_length in (7, 10, 13):
        enc = tok(a, b, padding="longest", truncation="longest_first", max_length=max_length)
        cases["batches"].append({"texts": a, "pairs": b, "padding": "longest", "truncation": True, "max_length": max_length,
                                 **{k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}})
    for text in CORPUS[:12] + CORPUS[19:26]:
        ids = tok(text)["input_ids"]
        cases["decode"].append({"ids": ids, "skip_special_tokens": True, "text": tok.decode(ids, skip_special_tokens=True)})
        cases["decode"].append({"ids": ids, "skip_special_tokens": False, "text": tok.decode(ids, skip_special_tokens=False)})
    json.dump(cases, sys.stdout, ensure_ascii=False, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
