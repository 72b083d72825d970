"""A real byte-level BPE tokenizer, trained here on a small built-in corpus (no network).

The pipeline is each family's own: Qwen's (NFC, Qwen's split regex, byte level; transformers >= 5
rebuilds exactly this for qwen2/qwen3 models whatever tokenizer.json says) or Llama 3's (its split
regex, byte level, a <|begin_of_text|> prefix). Merges are learned with `tokenizers`' BpeTrainer;
every one of the 256 bytes is in the alphabet, so any text encodes. Special tokens come after the
learned vocabulary, as in the real models.
"""

from __future__ import annotations

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEFAULT_MERGES = 400

# English prose and a little Python and shell: enough repeated pairs for a few hundred merges.
CORPUS = (
    """The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran off
into the forest before anyone could ask it why. Reinforcement learning from the traffic of
agents turns every completion into a sample: the prompt, the output tokens and the log-probs the
model gave them. A reward arrives later, and the trainer uses it to make the good answers more
likely and the bad ones less likely. The gateway records the tokens exactly as they were served,
so nothing has to be tokenized twice, and the trainer learns from what the agent really saw.
When the weights change, the server is drained, paused, updated and verified before it serves
again. The new version is stamped on every token it produces afterwards.
Please answer the question in one short sentence. What is the capital of France? The capital of
France is Paris. What is two plus two? Two plus two is four. Thank you for your help today!
You are a helpful assistant. Think step by step, then give the final answer on its own line.
""",
    """def policy_update(model, optimizer, samples, config):
    \"\"\"One optimizer step on the samples.\"\"\"
    for batch in make_batches(samples, config.max_tokens):
        loss = compute_loss(model, batch)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return {"loss": float(loss), "tokens": len(samples)}


class Trajectory:
    def __init__(self, session_id: str, steps: list[dict]) -> None:
        self.session_id = session_id
        self.steps = steps

    def __len__(self) -> int:
        return len(self.steps)


for i in range(10):
    if i % 2 == 0:
        print(f"even {i}")
    else:
        print(f"odd {i}")
""",
    """#!/usr/bin/env bash
set -euo pipefail
python -m pytest -q tests/unit
git commit -m "Fix the tokenizer" && git push origin main
curl -s http://localhost:8000/v1/chat/completions -H "Content-Type: application/json" \\
  -d '{"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]}'
{"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": {"role":
"assistant", "content": "Hello! How can I help you today?"}, "finish_reason": "stop"}]}
""",
)


def train_bpe(family_split: str, special_tokens: list[str], merges: int = DEFAULT_MERGES):
    """A `tokenizers.Tokenizer` with 256 byte symbols, up to `merges` learned merges, then the
    special tokens (ids after the vocabulary). `family_split` is 'qwen' or 'llama3'."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, trainers
    from tokenizers import pre_tokenizers as pre

    byte_level = pre.ByteLevel(add_prefix_space=False, use_regex=False)
    regex = {"qwen": QWEN_SPLIT, "llama3": LLAMA3_SPLIT}[family_split]
    tokenizer = Tokenizer(models.BPE())
    if family_split == "qwen":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre.Sequence(
        [pre.Split(Regex(regex), behavior="isolated", invert=False), byte_level]
    )
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + merges,
        min_frequency=1,  # the corpus is small: a pair seen once may merge too
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in special_tokens]
    )
    return tokenizer
