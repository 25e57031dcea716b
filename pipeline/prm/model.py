"""The process reward model: which lines it scores, its labels and training rows, its training loss, batched
scoring and held-out metrics.

A PRM here is the policy's own causal LM (the student architecture and
weights, `prm_from_policy`) whose LM head is read as a verifier. It reads the
prompt and the completion's scored lines (each `Step k:` line, then the
`Answer:` line), joined by newlines. The verdict on token t is
sigmoid(logit of token t at position t - 1): "is writing this token here
right?". A line's score is the product of its tokens' verdicts, the
probability that line k is right given everything before it. Training needs
only line labels (BCE on that product, as in multiple-instance learning),
never a label per token. Beside it the PRM keeps learning to write the gold
chains (next-token cross-entropy, `prm_loss(chain_weight=...)`), as generative
verifiers do (GenRM, Zhang et al. 2024): a verifier that knows the right next
token checks a written one better.

Why not a one-logit head at each line's last token (transformers'
token-classification head, this project's first PRM): the
default student has two layers. Where it writes a value it has just looked the
key up in the table (the lookup it was drilled on), so its LM head at the
position before a token is where a check of that token is cheapest; a verdict
that must travel on to the line's last token needs a third hop. The heads
compared: docs/experiments/prm-lm-head-verdicts.md; writing the chains:
docs/experiments/prm-writes-gold-chains.md.

    scorer = PRMScorer.load("models/prm")
    scorer.score([prompt], [scored_lines(completion)])  # -> [[p_step1, ..., p_answer]]
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError

from pipeline.core import paths, sharding
from pipeline.core.io import InputError, read_rows
from pipeline.data import task as tasks
from pipeline.data.grading import extract_answer, grade, infer_answer_type, step_value
from pipeline.data.params import SynthesizeConfig
from pipeline.inference.generation import pad, pad_id
from pipeline.modeling import chat
from pipeline.prm.params import PRMConfig, PRMDataConfig

# A completion with no Step and no Answer line has nothing to verify: it gets the lowest score.
EMPTY_SCORE = 0.0
AGGREGATIONS = ("min", "last", "mean")
# gold: 0/1 labels, BCE; mcts: log_boost(Q) in [0, 1], MSE; chain: a gold chain (data/prm_data/chains.parquet),
# next-token cross-entropy on its lines instead of a verdict loss; contrast: a gold chain cut at a choice step, right
# or wrong there (pipeline/prm/contrast.py), 0/1 labels like gold.
# mc: the share of Monte-Carlo rollouts after a step that reach the right answer (a dataset task), BCE on it.
LABEL_KINDS = {"gold": 0, "mcts": 1, "chain": 2, "contrast": 0, "mc": 0}
Span = tuple[int, int]  # a line's tokens: [first, last + 1)
PRM_MARK = "prm_verdict"  # config.json key of a trained PRM: how its logits are read ("next_token")


def scored_lines(completion: object) -> list[str]:
    """The steps a PRM scores, in order (`pipeline.data.task`): for the chart task every `Step` line up to the first
    `Answer:` line, and that line; for a dataset its lines or paragraphs up to the one that states the answer.

    `completion`: one completion's text, or a `pipeline.inference.generation.Generation` (its `.text`); None (no
    completion) has no lines. Anything else (the list of Generations `generate` gives per prompt) is a TypeError."""
    from pipeline.inference.generation import Generation

    if isinstance(completion, Generation):
        completion = completion.text
    if completion is not None and not isinstance(completion, str):
        raise TypeError(f"scored_lines takes one completion: its text (a str) or a Generation, not a "
                        f"{_kind(completion)}; generate() gives a list per prompt of Generations, so one completion "
                        "is out[i][j] (or out[i][j].text)")
    return tasks.active().steps(completion)


def _kind(value: object) -> str:
    """'list of Generation', 'dict', ...: what was passed, for a TypeError."""
    if isinstance(value, (list, tuple)) and value:
        return f"{type(value).__name__} of {type(value[0]).__name__}"
    return type(value).__name__


def is_terminal(line: str) -> bool:
    """Does this step state the answer?"""
    return tasks.active().is_terminal(line)


def line_labels(lines: Sequence[str], row: dict) -> list[float]:
    """Gold labels from the Chain-of-Functions values: step k is 1 if its value matches gold step k.

    The `Answer:` line is 1 if the final answer is right. A step beyond the
    gold chain, or one without a value, is 0.
    """
    gold_values = [s["value"] for s in row["steps"]] if "steps" in row else list(row["step_values"])
    labels, k = [], 0
    for line in lines:
        if is_terminal(line):
            labels.append(float(grade(extract_answer(line), row["answer"], row["answer_type"])))
            continue
        value = step_value(line)
        ok = (k < len(gold_values) and value is not None
              and grade(value, gold_values[k], infer_answer_type(gold_values[k])))
        labels.append(float(ok))
        k += 1
    return labels


# The step-label columns a reader requires (docs/design.md, "Data contracts"; task_type is not needed here).
STEP_LABEL_COLUMNS = ("id", "prompt", "steps", "labels", "source")


def chain_rows(questions: list[dict]) -> list[dict]:
    """Each question's gold chain as a step-label row: its steps, each labelled by the grader against the gold step
    values (the chart task), or 1 (a dataset's worked solution, right by construction)."""
    out = []
    graded = tasks.active().has_gold_step_values
    for q in questions:
        lines = scored_lines(q["rationale"])
        labels = line_labels(lines, q) if graded else [1.0] * len(lines)
        out.append({"id": q["id"], "prompt": q["prompt"], "steps": lines, "labels": labels,
                    "source": "chain", "task_type": q["task_type"]})
    return out


def new_questions(cfg: PRMDataConfig, synth: SynthesizeConfig) -> list[dict]:
    """The prm_data stage's new training questions, in order: `gold_questions`, `mcts_questions`, then
    `chain_questions`."""
    # Imported here: the evaluate stage imports this module and runs no generator code.
    from pipeline.data.cof.generate import more_train_questions

    return more_train_questions(synth, cfg.gold_questions + cfg.mcts_questions + cfg.chain_questions,
                                cfg.question_seed, prefix="prm")


def training_rows(cfg: PRMConfig, more_chains: Sequence[dict] = ()) -> tuple[list[dict], list[dict], list[dict]]:
    """What the prm stage trains on: (labelled paths of `cfg.sources`, contrast paths, gold chains to write).

    `more_chains` are appended to chains.parquet's, as `prm_data.chain_questions` would add them
    (experiments/prm_variants.py).
    """
    from pipeline.prm.contrast import contrast_rows  # imported here: only the stages that build rows run it

    train_file = paths.split_file("train", "prm_data")
    rows = [r for r in read_rows(train_file, required=STEP_LABEL_COLUMNS) if r["source"] in cfg.sources]
    if not rows:
        raise InputError(f"{train_file}: no step-label rows from the sources {cfg.sources}")
    chains_file = paths.prm_chains_file()
    chains = []
    if cfg.chain_weight or cfg.contrast:
        chains = read_rows(chains_file, required=STEP_LABEL_COLUMNS) + list(more_chains)
    contrast = contrast_rows(chains, cfg.contrast, random.Random(cfg.seed)) if cfg.contrast else []
    return rows, contrast, chains if cfg.chain_weight else []


def log_boost(q: float) -> float:
    """PROPA's node label: ln(1 + 10 Q) / ln(11), which lifts small success rates (0 -> 0, 1 -> 1)."""
    return math.log1p(10.0 * q) / math.log(11.0)


def aggregate(scores: Sequence[float], how: str) -> float:
    """One score for a whole solution from its line scores (min / last / mean); EMPTY_SCORE when there are none."""
    if not scores:
        return EMPTY_SCORE
    if how == "min":
        return min(scores)
    if how == "last":
        return scores[-1]
    if how == "mean":
        return sum(scores) / len(scores)
    raise ValueError(f"unknown PRM aggregation {how!r}; expected one of {AGGREGATIONS}")


def encode(tokenizer, prompt: str, lines: Sequence[str]) -> tuple[list[int], list[Span]]:
    """(input ids, the token span of each line) for prompt + lines joined by newlines."""
    return encode_many(tokenizer, [prompt], [lines])[0]


def encode_many(tokenizer, prompts: Sequence[str],
                lines: Sequence[Sequence[str]]) -> list[tuple[list[int], list[Span]]]:
    """`encode` for many pairs with one call to the (fast, Rust) tokenizer: (ids, line spans) per pair.

    A line's span is [first token, last token + 1) of the tokens holding its characters; an empty line
    borrows the last token before it.
    """
    if not prompts:
        return []
    heads = [chat.render(tokenizer, p) for p in prompts]  # the prompt as the policy read it
    enc = tokenizer([p + "\n".join(ls) for p, ls in zip(heads, lines)], add_special_tokens=False)
    out = []
    for i, (prompt, pair_lines) in enumerate(zip(heads, lines)):
        ids, spans, start = enc["input_ids"][i], [], len(prompt)
        for line in pair_lines:
            end = start + len(line)
            first, last = enc.char_to_token(i, start) if line else None, enc.char_to_token(i, max(end - 1, 0))
            # A character without a token (never for a stripped line): keep the span inside the line's own tokens.
            last = last if last is not None else first if first is not None else len(ids) - 1
            spans.append((first if first is not None else last, last + 1))
            start = end + 1  # the newline
        out.append((ids, spans))
    return out


def shared_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of token sequences, leaving each at least one token of its own."""
    limit = min(len(s) for s in sequences) - 1
    n = 0
    while n < limit and all(s[n] == sequences[0][n] for s in sequences):
        n += 1
    return n


def collate(features: Sequence[dict], pad_value: int) -> dict[str, torch.Tensor]:
    """Right-padded ids and mask, and each scored line's token span with its label and kind (-1 pads).

    With `question` and `outcome` in every feature (`prm_train` for `prm.pair_weight`), also each path's
    question index and whether its answer is right (1), wrong (0) or neither (-1): what `pair_loss` pairs.
    """
    ids, mask = pad([f["input_ids"] for f in features], pad_value)
    slots = max(len(f["spans"]) for f in features)
    starts = torch.full((len(features), slots), -1, dtype=torch.long)
    ends = torch.full((len(features), slots), -1, dtype=torch.long)
    labels = torch.zeros((len(features), slots), dtype=torch.float)
    kinds = torch.zeros((len(features), slots), dtype=torch.long)
    for i, f in enumerate(features):
        s = len(f["spans"])
        if s:
            starts[i, :s], ends[i, :s] = torch.tensor(f["spans"]).T
        if "line_labels" in f:
            labels[i, :s], kinds[i, :s] = torch.tensor(f["line_labels"], dtype=torch.float), f["kind"]
    batch = {"input_ids": ids, "attention_mask": mask, "score_starts": starts, "score_ends": ends,
             "score_labels": labels, "score_kinds": kinds}
    if features and all("outcome" in f for f in features):
        batch["score_questions"] = torch.tensor([f["question"] for f in features], dtype=torch.long)
        batch["score_outcomes"] = torch.tensor([f["outcome"] for f in features], dtype=torch.float)
    return batch


def path_outcome(lines: Sequence[str], labels: Sequence[float], source: str) -> float:
    """1 if a labelled path ends in a right `Answer:` line, 0 if in a wrong one, -1 if it has none or its labels
    are MCTS values (not pairs for `pair_loss`)."""
    if source == "mcts" or not lines or not is_terminal(lines[-1]):
        return -1.0
    return float(labels[-1] >= 0.5)


def token_verdicts(states: torch.Tensor, input_ids: torch.Tensor, head: torch.nn.Linear | None = None) -> torch.Tensor:
    """log sigmoid(logit of token t at position t - 1) for every token t of [B, T] ids; 0 (sure) for t = 0.

    states [B, T, V]: the causal LM's logits over the same ids; or, with a plain LM `head` (`plain_lm_head`), its
    last hidden states [B, T, H], each token's logit then read alone (`token_logits`). The first token has no
    position before it; it is always prompt, never part of a scored line.
    """
    if head is not None:
        picked = token_logits(states[:, :-1], head, input_ids[:, 1:])
    else:
        picked = states[:, :-1].float().gather(2, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return F.pad(F.logsigmoid(picked), (1, 0))


def line_log_probs(verdicts: torch.Tensor, starts: torch.Tensor,
                   ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log P(line right) = the sum of its tokens' log verdicts, validity mask) per scored line.

    verdicts [B, T] (`token_verdicts`); starts and ends [B, S], -1 for a padding slot. A sum under a mask,
    not a difference of running sums, so a long prompt's very unsure tokens cannot swamp a line's own.
    """
    at = torch.arange(verdicts.shape[1], device=verdicts.device)
    inside = (at >= starts.unsqueeze(-1)) & (at < ends.unsqueeze(-1))  # [B, S, T]
    return (inside * verdicts.unsqueeze(1)).sum(-1), starts >= 0


def prm_loss(logits: torch.Tensor, input_ids: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
             labels: torch.Tensor, kinds: torch.Tensor, chain_weight: float = 0.0,
             questions: torch.Tensor | None = None,
             outcomes: torch.Tensor | None = None, pair_weight: float = 0.0) -> torch.Tensor:
    """Mean over scored lines: BCE on 0/1 gold labels, MSE between P(line right) and log_boost on MCTS labels;
    plus `chain_weight` x next-token cross-entropy on the lines of the batch's gold chains (kind `chain`);
    plus `pair_weight` x `pair_loss` over the batch's paths (`questions`, `outcomes` from `collate`)."""
    log_p, valid = line_log_probs(token_verdicts(logits, input_ids), starts, ends)
    chain = kinds == LABEL_KINDS["chain"]
    loss = line_loss(log_p, valid & ~chain, labels, kinds)
    rows = chain[:, 0] & valid[:, 0]
    if chain_weight and rows.any():
        loss = loss + chain_weight * chain_loss(logits[rows], input_ids[rows], starts[rows], ends[rows])
    if pair_weight and questions is not None:
        loss = loss + pair_weight * pair_loss(log_p, valid, questions, outcomes)
    return loss


def pair_loss(log_p: torch.Tensor, valid: torch.Tensor, questions: torch.Tensor,
              outcomes: torch.Tensor) -> torch.Tensor:
    """Within-question ranking, what best-of-N asks of the PRM: the mean over (right, wrong) pairs of paths of one
    question of -log sigmoid(logit m_right - logit m_wrong), m a path's mean line probability (evaluate's `mean`).

    log_p, valid [B, S] (`line_log_probs`); questions [B] (an index per question); outcomes [B]: 1 right answer,
    0 wrong, -1 neither (never paired). Line BCE asks each line to be right or wrong in itself, so a hard
    question's right path may sit below an easy question's wrong one at no cost; this term prices only the order
    within a question (Bradley-Terry on paths, as outcome reward models are trained on preference pairs).
    0 when the batch holds no such pair.
    """
    mean = (log_p.exp() * valid).sum(1) / valid.sum(1).clamp(min=1)
    z = torch.logit(mean, eps=1e-6)
    pairs = (questions[:, None] == questions[None, :]) & (outcomes[:, None] == 1) & (outcomes[None, :] == 0)
    if not pairs.any():
        return log_p.sum() * 0.0  # keeps the graph (and the loss's device and dtype)
    return F.softplus(z[None, :] - z[:, None])[pairs].mean()


def chain_loss(logits: torch.Tensor, input_ids: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy on the tokens of each row's scored lines (first line's start to last line's end).

    SFT on gold chains, beside the verdict loss (the GenRM recipe: a verifier that keeps training as a
    generator). The verdicts read the same logits; the softmax makes the right token beat the others at a
    position, which the per-token sigmoid alone does not ask for.
    """
    at = torch.arange(input_ids.shape[1], device=input_ids.device)
    first, last = starts[:, :1], ends.max(dim=1, keepdim=True).values
    targets = input_ids.masked_fill((at < first) | (at >= last), -100)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets[:, 1:].flatten())


def line_loss(log_p: torch.Tensor, valid: torch.Tensor, labels: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
    """`prm_loss` from each line's log P(right) [B, S] and its validity mask, whatever head gave them."""
    # log(1 - p), kept finite (and its gradient alive) when every token is sure and log p rounds to 0.
    log_not_p = torch.log(-torch.expm1(log_p - 1e-6))
    bce = -(labels * log_p + (1 - labels) * log_not_p)
    mse = (log_p.exp() - labels) ** 2
    per_line = torch.where(kinds == LABEL_KINDS["mcts"], mse, bce)
    return (per_line * valid).sum() / valid.sum().clamp(min=1)


def prm_from_policy(path: Path | str, extra_layers: int = 0):
    """A PRM to train: the policy's causal LM from `path`, marked as a PRM in its config (`PRM_MARK`).

    `extra_layers` decoder layers go on top of the policy's, each starting as the
    identity (its attention and MLP outputs zeroed), so the untrained PRM reads
    exactly as the policy does and training decides what the new depth adds.
    """
    from pipeline.modeling.models import MASTER_DTYPE, load_weights

    model = load_weights(path, MASTER_DTYPE)
    if extra_layers:
        model = _deepened(model, extra_layers)
    setattr(model.config, PRM_MARK, "next_token")
    return model


def _deepened(model, extra: int):
    """`model` with `extra` identity-initialised decoder layers after its own (same architecture, deeper config)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    depth = config.num_hidden_layers
    config.num_hidden_layers = depth + extra
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types) + [config.layer_types[-1]] * extra
    deeper = AutoModelForCausalLM.from_config(config)
    missing, unexpected = deeper.load_state_dict(model.state_dict(), strict=False)
    new = {f"model.layers.{i}." for i in range(depth, depth + extra)}
    if unexpected or any(not any(key.startswith(prefix) for prefix in new) for key in missing):
        raise ValueError(f"cannot deepen {type(model).__name__}: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for layer in deeper.model.layers[depth:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return deeper


def _check_pairs(prompts: object, lines: object) -> None:
    """`PRMScorer.score`'s arguments as it reads them, or an error that says what it wants."""
    want = ("score(prompts, lines) takes a list of prompt texts and, per prompt, a list of its lines "
            "(scored_lines(completion))")

    def listlike(value: object) -> bool:  # a list, tuple or array; a str is a sequence of characters, not lines
        return not isinstance(value, (str, bytes)) and hasattr(value, "__len__") and hasattr(value, "__iter__")

    if not listlike(prompts):
        raise TypeError(f"{want}; prompts is a {_kind(prompts)}" + (" (one prompt: [prompt])"
                                                                   if isinstance(prompts, str) else ""))
    if not listlike(lines):
        raise TypeError(f"{want}; lines is a {_kind(lines)}")
    for prompt in prompts:
        if not isinstance(prompt, str):
            raise TypeError(f"{want}; a prompt is a {_kind(prompt)}")
    for one in lines:
        if isinstance(one, str):
            raise TypeError(f"{want}; an item of lines is a str (a completion's text? pass scored_lines(text))")
        if not listlike(one) or not all(isinstance(line, str) for line in one):
            raise TypeError(f"{want}; an item of lines is a {_kind(one)}, not a list of str")
    if len(prompts) != len(lines):
        raise ValueError(f"{want}; {len(prompts)} prompts but {len(lines)} lists of lines")


class PRMScorer:
    """Batched PRM scoring of (prompt, lines) pairs: one forward pass scores every line of every pair.

    Pairs with the same prompt (the N candidates of best-of-N, the children of a
    search node) share the tokens of their longest common prefix: the batch
    reads each distinct prefix once, keeps its KV cache, and reads only each
    pair's own tokens on top of it (a row of the cache per pair); equal pairs
    are read once. Each token's verdict is its own logit alone, through a plain
    LM head (`plain_lm_head`), not the whole vocabulary. The scores equal one
    forward pass per pair up to float rounding (tests/unit/test_prm.py).
    """

    def __init__(self, model, tokenizer, batch_size: int = 64, full_logits: bool = False) -> None:
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        self.pad_id = pad_id(tokenizer)
        self.tokens = 0  # tokens read so far (the PRM's share of a decoding strategy's cost)
        # A verdict needs one logit per token. Through a plain linear head that is one dot product of the hidden state
        # with the token's row of the head, not the whole vocabulary at every position (a [batch, length, vocab]
        # float tensor: 12 GB for 64 paths of 300 tokens over a 150k vocabulary). `full_logits` asks for the whole
        # head anyway (what a head that is not a plain linear layer gets; the bench's reference).
        self.head = None if full_logits else plain_lm_head(model)
        self.decoder = model.get_decoder() if self.head is not None else None

    @classmethod
    def load(cls, path: Path | str, batch_size: int = 64, device: torch.device | str | None = None) -> "PRMScorer":
        """A saved PRM on `device` (default: the GPU when there is one)."""
        from transformers import AutoModelForCausalLM

        from pipeline.modeling.models import default_device, load_kwargs, load_tokenizer

        try:
            tokenizer = load_tokenizer(path)
            model = AutoModelForCausalLM.from_pretrained(str(path), **load_kwargs())
        except (OSError, ValueError, SafetensorError) as exc:  # missing, truncated or corrupted files
            raise InputError(f"{path}: cannot load the PRM: {exc}") from exc
        if getattr(model.config, PRM_MARK, None) != "next_token":
            raise InputError(f"{path}: not a PRM checkpoint (its config.json has no {PRM_MARK!r}: a policy, or a PRM "
                             "from an older version of this pipeline); train one with `python -m stages.prm`")
        return cls(model.to(device or default_device()), tokenizer, batch_size)

    @torch.inference_mode()
    def score(self, prompts: Sequence[str], lines: Sequence[Sequence[str]]) -> list[list[float]]:
        """For each pair, the probability that each line is right; [] for a pair without lines.

        `prompts`: a list of prompt texts; `lines`: one list of lines per prompt (`scored_lines(completion)`). What
        it cannot read (a bare string, a Generation, a completion's text in place of its lines, lists of unequal
        length) is a TypeError or ValueError naming what it wants."""
        _check_pairs(prompts, lines)
        # Equal pairs (a policy often samples the same solution twice) are read once.
        first: dict[tuple[str, tuple[str, ...]], int] = {}
        same = [first.setdefault((p, tuple(ls)), i) for i, (p, ls) in enumerate(zip(prompts, lines))]
        unique = sorted(first.values())
        encoded = dict(zip(unique, encode_many(self.tokenizer, [prompts[i] for i in unique],
                                               [lines[i] for i in unique])))
        out: dict[int, list[float]] = {i: [] for i in unique}
        groups: dict[str, list[int]] = {}
        for i in unique:
            if encoded[i][1]:
                groups.setdefault(prompts[i], []).append(i)
        # The tokens a prompt's pairs share. A group that a batch boundary splits keeps at least the whole group's cut
        # in both batches: read as one piece, a member left alone would pad the batch's own tokens to its length.
        cut_of_prompt = {prompt: shared_prefix([encoded[i][0] for i in group]) if len(group) > 1 else 0
                         for prompt, group in groups.items()}

        # A group stays contiguous (its prefix is read once per batch); groups whose own tokens are about as long
        # sit side by side, since those are what the batch pads (a lone pair's own tokens are all of its tokens).
        def own_tokens(group: list[int]) -> int:
            return max(len(encoded[i][0]) for i in group) - cut_of_prompt[prompts[group[0]]]

        order = [i for g in sorted(groups.values(), key=own_tokens) for i in g]
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            owners = [prompts[i] for i in batch]
            for i, probs in zip(batch, self._forward([encoded[i] for i in batch], owners, cut_of_prompt)):
                out[i] = probs
        return [list(out[i]) for i in same]

    def _forward(self, pairs: Sequence[tuple[list[int], list[Span]]], owners: Sequence[str],
                 least_cut: dict[str, int]) -> list[list[float]]:
        """Line scores of one batch: each owner's shared prefix once (left-padded), then every pair's own tokens.

        An owner's prefix is what its pairs in the batch share; one pair alone in the batch shares `least_cut`
        (its whole group's), and a batch of one pair is read in one piece.
        """
        from transformers import DynamicCache

        device = self.model.device
        members: dict[str, list[int]] = {}
        for row, owner in enumerate(owners):
            members.setdefault(owner, []).append(row)
        groups = list(members.values())
        cuts = [0] if len(pairs) == 1 else [shared_prefix([pairs[r][0] for r in rows]) if len(rows) > 1
                                            else least_cut.get(owners[rows[0]], 0) for rows in groups]
        group_of = [0] * len(pairs)
        for g, rows in enumerate(groups):
            for r in rows:
                group_of[r] = g
        cut_of = [cuts[g] for g in group_of]
        sharing = [g for g, cut in enumerate(cuts) if cut]  # the groups with a prefix: only those run the first pass
        # Row r of the batch takes its group's prefix (cache and mask); a group without one borrows any cache row
        # (the first), all of whose columns its mask hides.
        slot = {g: k for k, g in enumerate(sharing)}
        rows_of_prefixes = torch.tensor([slot.get(g, 0) for g in group_of])
        prefix_ids, prefix_mask = pad([pairs[rows[0]][0][:cut] for rows, cut in zip(groups, cuts)], self.pad_id,
                                      left=True)
        rest_ids, rest_mask = pad([ids[cut:] for (ids, _), cut in zip(pairs, cut_of)], self.pad_id)
        width = prefix_ids.shape[1]
        cache, prefix_verdicts = None, torch.zeros((len(groups), width))
        if width:
            # Left padding: every prefix ends at the last column, so the pairs' own tokens follow on directly.
            cache = DynamicCache(config=self.model.config)
            ids, mask = prefix_ids[sharing], prefix_mask[sharing]
            positions = (mask.cumsum(1) - 1).clamp(min=0)
            ids = ids.to(device)
            prefix_states = self._states(input_ids=ids, attention_mask=mask.to(device),
                                         position_ids=positions.to(device), cache=cache, use_cache=True)
            prefix_verdicts[sharing] = token_verdicts(prefix_states, ids, self.head).cpu()
            last = prefix_states[:, -1:][rows_of_prefixes.to(device)]  # what comes before each pair's first own token
            cache.batch_select_indices(rows_of_prefixes.to(device))  # one cache row per pair
        mask = torch.cat([prefix_mask[torch.tensor(group_of)], rest_mask], dim=1)
        positions = torch.tensor(cut_of).unsqueeze(1) + torch.arange(rest_ids.shape[1]).unsqueeze(0)
        rest_ids = rest_ids.to(device)
        rest_states = self._states(input_ids=rest_ids, attention_mask=mask.to(device),
                                   position_ids=positions.to(device), cache=cache)
        if width:
            rest_verdicts = token_verdicts(torch.cat([last, rest_states], dim=1), torch.cat(
                [torch.zeros_like(rest_ids[:, :1]), rest_ids], dim=1), self.head)[:, 1:].cpu()
        else:
            rest_verdicts = token_verdicts(rest_states, rest_ids, self.head).cpu()
        self.tokens += int(prefix_mask.sum()) + int(rest_mask.sum())
        out = []
        for row, (ids, spans) in enumerate(pairs):
            g, cut = group_of[row], cut_of[row]
            # The pair's own sequence again: its share of the group's prefix, then its own tokens. Its first token
            # has no position before it (in the batch, a padding column does): no verdict, as in `token_verdicts`.
            token = torch.cat([prefix_verdicts[g, width - cut:], rest_verdicts[row, : len(ids) - cut]])
            token[0] = 0.0
            out.append([math.exp(token[a:b].sum().item()) for a, b in spans])
        return out

    def _states(self, **inputs) -> torch.Tensor:
        """What `token_verdicts` reads at every position: the last hidden states through a plain head, else the
        logits."""
        if self.head is None:
            return self.model(**inputs).logits
        return self.decoder(**inputs).last_hidden_state


# Config keys of heads that scale or cap their logits (Gemma 2 and 3, Cohere, Granite): such a head is never plain.
SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def token_logits(hidden: torch.Tensor, head: torch.nn.Linear, ids: torch.Tensor) -> torch.Tensor:
    """The logit of token `ids` read from `hidden` through a plain linear head, in float32: hidden [..., H] and
    ids [...] broadcast together. One row of the head per token, not the whole vocabulary; float32 as a matrix
    product accumulates (a bfloat16 sum over the hidden size would not), whatever the head's and body's dtypes."""
    logits = (hidden.float() * head.weight[ids].float()).sum(-1)
    return logits if head.bias is None else logits + head.bias[ids].float()


def plain_lm_head(model) -> torch.nn.Linear | None:
    """The model's LM head when `token_logits` through it gives the model's own logits, else None (a head that
    scales or caps its logits, as Gemma 2's does, quantised weights, or no causal-LM head at all).

    Checked on the model itself, at 8 probe positions and 64 tokens spread over the vocabulary each, rather than
    trusted from the architecture's name; a probe that fails in any way means the whole head is read.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and sharding.sharded(model):  # FSDP: each rank holds some rows of the head, not all
        return None
    config = getattr(model, "config", None)
    if (not isinstance(head, torch.nn.Linear) or not head.weight.is_floating_point()
            or any(getattr(config, key, None) not in (None, 1, 1.0) for key in SCALED_LOGITS)):
        return None
    vocab, device = head.out_features, head.weight.device
    ids = torch.arange(min(8, vocab), device=device).unsqueeze(0)
    tokens = torch.linspace(0, vocab - 1, min(64, vocab), device=device).long()
    try:
        decoder = model.get_decoder()
        if decoder is None or decoder is model:
            return None
        with torch.inference_mode():
            logits = model(input_ids=ids).logits
            theirs = logits[..., tokens].float()  # [1, 8, 64]
            hidden = decoder(input_ids=ids).last_hidden_state.unsqueeze(2)  # [1, 8, 1, H]
            mine = token_logits(hidden, head, tokens.expand(*theirs.shape))
    except Exception:  # noqa: BLE001 - any decoder this cannot call is read the old way, never a crash at load
        return None
    # Equal up to the rounding of the model's own dtype (bfloat16 logits are rounded to 8 bits).
    tolerance = max(1e-5, 2 * torch.finfo(logits.dtype).eps)
    return head if torch.allclose(mine, theirs, rtol=tolerance, atol=tolerance) else None


def check_tokenizer(prm_tokenizer, policy_tokenizer, prm_path: Path | str, policy_path: Path | str) -> None:
    """A PRM guides only the policy family it was trained with: the two vocabularies must be the same."""
    prm_vocab, policy_vocab = prm_tokenizer.get_vocab(), policy_tokenizer.get_vocab()
    if prm_vocab != policy_vocab:
        differ = sum(policy_vocab.get(tok) != i for tok, i in prm_vocab.items())
        raise InputError(
            f"{prm_path}: the PRM's tokenizer ({len(prm_vocab)} tokens) does not match the policy's at {policy_path} "
            f"({len(policy_vocab)} tokens, {differ} entries differ); train the PRM from this policy (prm_data.policy) "
            "or evaluate a policy with the same tokenizer"
        )


def auroc(labels: Sequence[float], scores: Sequence[float]) -> float | None:
    """Area under the ROC curve: P(score of a random positive > a random negative), ties half (Mann-Whitney).

    None when one class is missing (the AUROC is undefined).
    """
    pairs = sorted(zip(scores, labels))
    positives = sum(1 for _, y in pairs if y >= 0.5)
    negatives = len(pairs) - positives
    if positives == 0 or negatives == 0:
        return None
    rank_sum, i = 0.0, 0
    while i < len(pairs):
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        mid_rank = (i + 1 + j) / 2  # ranks i+1..j share their mean
        rank_sum += mid_rank * sum(1 for _, y in pairs[i:j] if y >= 0.5)
        i = j
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def calibration(labels: Sequence[float], scores: Sequence[float], bins: int = 10) -> list[dict]:
    """Reliability table: per score bin, the mean predicted score, the observed rate of right lines, the count."""
    table = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [(s, y) for s, y in zip(scores, labels) if lo <= s < hi or (b == bins - 1 and s == 1.0)]
        if members:
            table.append({
                "bin": round((lo + hi) / 2, 3),
                "predicted": round(sum(s for s, _ in members) / len(members), 4),
                "observed": round(sum(y for _, y in members) / len(members), 4),
                "lines": len(members),
            })
    return table


def expected_calibration_error(table: Sequence[dict]) -> float:
    total = sum(r["lines"] for r in table)
    return round(sum(r["lines"] * abs(r["predicted"] - r["observed"]) for r in table) / max(total, 1), 4)


def held_out(scorer: PRMScorer, rows: list[dict]) -> tuple[dict, list[dict]]:
    """AUROC, accuracy at 0.5 and calibration of the PRM on labelled rows; (metrics, calibration table)."""
    scores = scorer.score([r["prompt"] for r in rows], [r["steps"] for r in rows])
    flat = [(y, s, is_terminal(line)) for r, ss in zip(rows, scores) for y, s, line in zip(r["labels"], ss, r["steps"])]
    labels, probs = [y for y, _, _ in flat], [s for _, s, _ in flat]
    table = calibration(labels, probs)

    def area(keep) -> float | None:
        subset = [(y, s) for y, s, terminal in flat if keep(terminal)]
        value = auroc([y for y, _ in subset], [s for _, s in subset])
        return None if value is None else round(value, 4)

    def share(hits: int) -> float | None:  # None over no lines, as AUROC: not a measured 0
        return round(hits / len(labels), 4) if labels else None

    return {
        "lines": len(flat),
        "within_question": within_question(rows, scores),
        "positive_share": share(sum(y >= 0.5 for y in labels)),
        "auroc": area(lambda terminal: True),
        "auroc_steps": area(lambda terminal: not terminal),
        "auroc_answers": area(lambda terminal: terminal),
        "accuracy": share(sum((s >= 0.5) == (y >= 0.5) for y, s in zip(labels, probs))),
        "ece": expected_calibration_error(table) if labels else None,
    }, table


def within_question(rows: list[dict], scores: list[list[float]]) -> dict:
    """What best-of-N needs: among completions of one question, does the PRM rank a right answer above a wrong one?

    The share of (right, wrong) pairs of the same question ordered right (ties half), per aggregation of the
    line scores; the AUROC above also rewards telling easy questions from hard ones, this does not.
    """
    by_question: dict[str, list[tuple[float, list[float]]]] = {}
    for r, s in zip(rows, scores):
        right = float(is_terminal(r["steps"][-1]) and r["labels"][-1] >= 0.5)
        by_question.setdefault(r["id"], []).append((right, s))
    out: dict = {}
    for how in AGGREGATIONS:
        won = pairs = 0.0
        for items in by_question.values():
            scored = [(y, aggregate(s, how)) for y, s in items]
            for y_a, a in scored:
                for y_b, b in scored:
                    if y_a > y_b:
                        pairs += 1
                        won += 1.0 if a > b else 0.5 if a == b else 0.0
        out[f"pair_accuracy_{how}"] = round(won / pairs, 4) if pairs else None
    out["pairs"] = int(pairs)
    return out
