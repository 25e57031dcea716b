"""The compacting decode loop against transformers' own `generate`, on a tiny random Qwen2."""

from __future__ import annotations

import pytest
import torch

from pipeline.inference.generation import LocalSampler, decode, generate
from pipeline.modeling.models import build_student, train_tokenizer
from pipeline.modeling.params import BaseModelConfig

PROMPTS = ["Question: what is 3+4?\n", "Q: 12-5\n", "Question: what is the largest of 2, 9 and 4?\n", "7*8=\n"]


@pytest.fixture(scope="module")
def tiny():
    texts = [f"Question: what is {a}+{b}?\nStep 1: {a} + {b} = {a + b}.\nAnswer: {a + b}"
             for a in range(12) for b in range(12)]
    tok = train_tokenizer(texts, 300)
    cfg = BaseModelConfig(seed=0, vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    model = build_student(cfg, tok)
    with torch.no_grad():  # wide weights: different prompts give different continuations
        for param in model.parameters():
            param.normal_(0.0, 0.5)
    return model.eval(), tok


def reference(model, tok, eos_id: int, max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy generate on the same left-padded batch, cut after EOS."""
    tok.padding_side = "left"
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_id,
                             pad_token_id=tok.pad_token_id)
    rows = []
    for ids in out[:, enc["input_ids"].shape[1] :].tolist():
        rows.append(ids[: ids.index(eos_id) + 1] if eos_id in ids else ids)
    return rows


def test_greedy_decode_matches_transformers_generate_while_rows_leave_the_batch(tiny):
    model, tok = tiny
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    free = decode(model, enc["input_ids"], enc["attention_mask"], 12, eos_id=-1)
    # make the 3rd token of row 0 the "EOS": row 0 leaves the batch early, the others continue
    eos_id = free[0][2]
    ours = decode(model, enc["input_ids"], enc["attention_mask"], 12, eos_id=eos_id)
    assert ours == reference(model, tok, eos_id, 12)
    assert len(ours[0]) == 3 and ours[0][-1] == eos_id
    assert max(len(r) for r in ours) > 3  # some row outlived row 0


def test_generate_keeps_caller_order_and_counts_tokens(tiny):
    model, tok = tiny
    batched = generate(model, tok, PROMPTS, max_new_tokens=10, batch_size=2, progress=False)
    alone = [generate(model, tok, [p], max_new_tokens=10, progress=False)[0] for p in PROMPTS]
    assert batched == alone
    assert all(len(g) == 1 and 1 <= g[0].tokens <= 10 for g in batched)


def test_sampling_is_seeded_and_returns_k_per_prompt(tiny):
    model, tok = tiny
    sampler = LocalSampler(model, tok, batch_size=8)
    a = sampler.sample(PROMPTS, n=3, temperature=1.0, top_p=0.9, max_new_tokens=8, seed=1)
    b = sampler.sample(PROMPTS, n=3, temperature=1.0, top_p=0.9, max_new_tokens=8, seed=1)
    c = sampler.sample(PROMPTS, n=3, temperature=1.0, top_p=0.9, max_new_tokens=8, seed=2)
    assert a == b and a != c
    assert [len(g) for g in a] == [3] * len(PROMPTS)


def test_tiny_top_p_is_greedy(tiny):
    """With top_p near 0 only the most likely token survives the nucleus: sampling equals greedy."""
    model, tok = tiny
    greedy = generate(model, tok, PROMPTS, max_new_tokens=8, progress=False)
    nucleus = generate(model, tok, PROMPTS, max_new_tokens=8, do_sample=True, temperature=1.0, top_p=1e-6,
                       progress=False)
    assert nucleus == greedy


class Vocabulary:
    """A tokenizer stand-in for `token_texts`: a fixed id -> text table, decoded one token at a time."""

    def __init__(self, texts: dict[int, str]) -> None:
        self.texts = texts

    def get_vocab(self) -> dict[str, int]:
        return {f"t{i}": i for i in self.texts}

    def batch_decode(self, rows):
        return [self.texts[row[0]] for row in rows]


def test_a_blank_line_after_text_ends_a_row_however_the_newlines_are_tokenized():
    from pipeline.inference.generation import BlankLineStop

    vocab = Vocabulary({0: "a", 1: "\n", 2: "\n\n", 3: " ", 4: ".\n", 5: "\nb", 6: "x\n\ny", 7: ".\n\n", 8: ""})
    rule = BlankLineStop(vocab)
    # each row's tokens, one per step; the step at which it should end (None: it runs on)
    rows = [
        ([1, 1, 0, 1, 3, 1], 5),     # leading newlines do not count; "a\n \n" ends at the second newline
        ([0, 2, 0, 0, 0, 0], 1),     # "a" then one "\n\n" token
        ([0, 4, 5, 0, 0, 0], 2),     # "a.\n" then "\nb": the break is inside the next token's leading newline
        ([6, 0, 0, 0, 0, 0], 0),     # a blank line inside one token
        ([7, 0, 0, 0, 0, 0], 0),     # ".\n\n": text then two newlines in one token
        ([0, 1, 0, 1, 0, 8], None),  # single newlines and an empty (special) token never end a paragraph
        ([2, 2, 0, 1, 8, 1], 5),     # "\n\n\n\na\n" + "" + "\n": an empty token keeps the run of newlines
    ]
    tracker = rule.tracker(len(rows), "cpu")
    ended: list[int | None] = [None] * len(rows)
    for step in range(6):
        stops = tracker.step(torch.tensor([tokens[step] for tokens, _ in rows]))
        for r, stop in enumerate(stops.tolist()):
            if stop and ended[r] is None:
                ended[r] = step
    assert ended == [want for _, want in rows]
    # rows leave the batch: the tracker follows the rows kept
    tracker = rule.tracker(2, "cpu")
    tracker.step(torch.tensor([0, 1]))
    tracker.step(torch.tensor([1, 0]))  # row 0: "a\n", row 1: "\na"
    tracker.keep(torch.tensor([1]))
    assert tracker.step(torch.tensor([1])).tolist() == [False]  # row 1 has "\na\n": one newline after its text
    assert tracker.step(torch.tensor([1])).tolist() == [True]


def test_decoding_with_the_blank_line_rule_cuts_each_row_at_its_first_paragraph(tiny):
    import copy
    import re

    from pipeline.evaluation.search import newline_ids
    from pipeline.inference.generation import BlankLineStop

    model, tok = tiny
    model = copy.deepcopy(model)
    # A head that favours newline tokens, so that blank lines occur within 40 tokens.
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[newline_ids(tok)] = 3.0
    model.lm_head = head
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    free = decode(model, enc["input_ids"], enc["attention_mask"], 40, eos_id=-1)
    cut = decode(model, enc["input_ids"], enc["attention_mask"], 40, eos_id=-1, stop=BlankLineStop(tok))

    def first_paragraph(tokens):
        for k in range(1, len(tokens) + 1):
            if re.search(r"\S[^\S\n]*\n\s*\n", tok.decode(tokens[:k])):
                return tokens[:k]
        return tokens

    assert cut == [first_paragraph(row) for row in free]
    assert any(len(c) < len(f) for c, f in zip(cut, free))  # some row met a blank line
