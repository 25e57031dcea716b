"""Step-level search with a policy: one reasoning step at a time, many questions per batch.

A step is a line, or a paragraph with `task.step_split: paragraph` (pipeline/data/task.py); "line"
below means either.

- `StepPolicy` samples next lines for many prefixes at once (it stops at the
  newline, or at a paragraph's blank line) and completes prefixes greedily; it counts the tokens
  it generates.
- `mcts` is the tree search of PROPA (docs/methods.md, "Step labels"), shared by the step labels
  of `prm_data` (a node's value: does a greedy rollout from it reach the right
  answer) and PRM-MCTS decoding in `evaluate` (a node's value: the PRM's score
  of its last line). Every tree advances one iteration per batched call.
- `beam_search` keeps, at each step, the `width` candidate lines the PRM scores
  highest among about `n` sampled ones.

A path is the tuple of lines below the prompt; the policy continues
`prompt + line1 + "\\n" + ... + line_k + "\\n"` (paragraphs: each ended by a blank line), what it wrote
itself, the prompt as the policy reads it (`StepPolicy.render`: raw, or templated by `pipeline.modeling.chat`).
The PRM reads a path's steps as `Task.steps` gives them (`scored`: a paragraph's whitespace collapsed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from pipeline.data import task as tasks
from pipeline.inference.generation import BlankLineStop, generate, token_texts
from pipeline.modeling import chat
from pipeline.prm.model import aggregate

Path = tuple[str, ...]


@dataclass(frozen=True)
class Line:
    text: str  # the line, stripped, without its newline
    tokens: int  # tokens the policy generated for it
    terminal: bool  # a line that states the answer (`Task.ends_path`), or the policy stopped (EOS or the token limit)


def prefix(prompt: str, lines: Path) -> str:
    """The prompt and the path's steps, each ended by the task's step break (a newline, or a blank line)."""
    return prompt + tasks.active().join(lines)


def completion(lines: Path) -> str:
    return tasks.active().step_break.join(lines)


def scored(lines: Path) -> Path:
    """A path's steps as the PRM reads them (`Task.steps`): a paragraph's whitespace collapsed."""
    return tuple(tasks.active().normalize(line) for line in lines)


def newline_ids(tokenizer) -> list[int]:
    """Every token whose text holds a newline: each ends a line (a tokenizer may merge ".\n")."""
    ids, texts = token_texts(tokenizer)
    return [i for i, text in zip(ids, texts) if "\n" in text]


class StepPolicy:
    """A local causal LM sampled one step at a time, or completed greedily.

    Newline tokens stop a line; with the active task's `step_split: paragraph`, a blank line after some
    text stops a paragraph (`BlankLineStop`).
    """

    def __init__(self, model, tokenizer, *, batch_size: int = 512, step_tokens: int = 64, completion_tokens: int = 192,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0) -> None:
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.step_tokens, self.completion_tokens = step_tokens, completion_tokens
        self.temperature, self.top_p, self.top_k, self.seed = temperature, top_p, top_k, seed
        self.task = tasks.active()  # its step break: where a sampled step ends (`Task.first_step`)
        self.paragraphs = self.task.step_split == "paragraph"
        self.stop_ids = [] if self.paragraphs else newline_ids(tokenizer)
        self.stop = BlankLineStop(tokenizer) if self.paragraphs else None
        # A paragraph may run as long as a whole completion (a MATH solution's); `step_tokens` is a line's limit.
        # A step cut by the limit ends its path either way (`Line.terminal`), as a completion cut would.
        self.step_limit = completion_tokens if self.paragraphs else step_tokens
        self.tokens = 0  # generated so far
        self._calls = 0

    def render(self, prompt: str) -> str:
        """What this policy reads before a question's first step (`pipeline.modeling.chat`)."""
        return chat.render(self.tokenizer, prompt)

    def _next_seed(self) -> int:
        self._calls += 1
        return self.seed * 1_000_003 + self._calls  # a fresh, reproducible stream per call

    def next_lines(self, prefixes: Sequence[str], n: int) -> list[list[Line]]:
        """`n` sampled next lines for each prefix."""
        if not prefixes:
            return []
        gens = generate(
            self.model, self.tokenizer, prefixes, max_new_tokens=self.step_limit, batch_size=self.batch_size,
            do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            num_return_sequences=n, seed=self._next_seed(), progress=False, stop_ids=self.stop_ids, stop=self.stop,
        )
        out = []
        for per_prefix in gens:
            lines = []
            for g in per_prefix:
                self.tokens += g.tokens
                line, ended = self.task.first_step(g.text)
                lines.append(Line(line, g.tokens, terminal=tasks.active().ends_path(line) or not ended))
            out.append(lines)
        return out

    def sample(self, prefixes: Sequence[str], n: int) -> list[list[str]]:
        """`n` sampled rests of each prefix, to EOS or the completion limit (Monte-Carlo step labels)."""
        if not prefixes:
            return []
        gens = generate(self.model, self.tokenizer, list(prefixes), max_new_tokens=self.completion_tokens,
                        batch_size=self.batch_size, do_sample=True, temperature=self.temperature, top_p=self.top_p,
                        top_k=self.top_k, num_return_sequences=n, seed=self._next_seed(), progress=False)
        self.tokens += sum(g.tokens for per_prefix in gens for g in per_prefix)
        return [[g.text for g in per_prefix] for per_prefix in gens]

    def complete(self, prefixes: Sequence[str]) -> list[str]:
        """The greedy rest of each prefix, to EOS or the token limit."""
        if not prefixes:
            return []
        gens = generate(self.model, self.tokenizer, prefixes, max_new_tokens=self.completion_tokens,
                        batch_size=self.batch_size, progress=False)
        self.tokens += sum(g[0].tokens for g in gens)
        return [g[0].text for g in gens]


@dataclass(eq=False)
class Node:
    lines: Path = ()
    parent: "Node | None" = None
    children: list["Node"] = field(default_factory=list)
    terminal: bool = False
    visits: int = 0
    total: float = 0.0
    value: float = 0.0  # what this node was worth when created (rollout reward or PRM score)

    @property
    def q(self) -> float:
        return self.total / self.visits if self.visits else 0.0

    def path(self) -> list["Node"]:
        """The nodes from the root's child down to this one."""
        nodes, node = [], self
        while node.parent is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()


def ucb(child: Node, parent_visits: int, c: float) -> float:
    """Q/N + c * sqrt(2 ln N_parent / N); an unvisited child first."""
    if child.visits == 0:
        return math.inf
    return child.q + c * math.sqrt(2.0 * math.log(max(parent_visits, 1)) / child.visits)


def select(root: Node, c: float) -> Node:
    node = root
    while node.children:
        node = max(node.children, key=lambda ch: ucb(ch, node.visits, c))
    return node


def backpropagate(node: Node | None, value: float) -> None:
    while node is not None:
        node.visits += 1
        node.total += value
        node = node.parent


# evaluate(question indices, new nodes) -> one value in [0, 1] per node
Evaluator = Callable[[list[int], list[Node]], list[float]]


def mcts(prompts: Sequence[str], policy: StepPolicy, evaluate: Evaluator, *, iterations: int, children: int,
         c: float, max_steps: int) -> list[Node]:
    """One tree per prompt, `iterations` rounds of select / expand `children` lines / evaluate / back-propagate.

    A selected terminal leaf is not expanded; its value is back-propagated again
    (a visit). Identical sampled lines under one parent become one child.
    """
    roots = [Node() for _ in prompts]
    heads = [policy.render(p) for p in prompts]
    for _ in tqdm(range(iterations), desc="mcts", unit="iteration", disable=not prompts):
        leaves = [select(root, c) for root in roots]
        grow = [i for i, leaf in enumerate(leaves) if not leaf.terminal]
        for leaf in leaves:
            if leaf.terminal:
                backpropagate(leaf, leaf.value)
        sampled = policy.next_lines([prefix(heads[i], leaves[i].lines) for i in grow], children)
        owners, created = [], []
        for i, lines in zip(grow, sampled):
            leaf, seen = leaves[i], set()
            for line in lines:
                if line.text in seen:
                    continue
                seen.add(line.text)
                lines_below = leaf.lines + (line.text,)
                node = Node(lines_below, leaf, terminal=line.terminal or len(lines_below) >= max_steps)
                leaf.children.append(node)
                owners.append(i)
                created.append(node)
        for node, value in zip(created, evaluate(owners, created)):
            node.value = value
            backpropagate(node, value)
    return roots


def mean_value(node: Node) -> float:
    """The mean value of the nodes on a node's path (PRM-MCTS ranks paths by it)."""
    path = node.path()
    return sum(p.value for p in path) / len(path)


def best_terminal(root: Node) -> Node | None:
    """The terminal node whose path has the highest mean value (PRM-MCTS's answer); None if there is none."""
    terminals = [n for n in root.walk() if n.terminal and n.parent is not None]
    return max(terminals, key=mean_value) if terminals else None


def beam_search(prompts: Sequence[str], policy: StepPolicy, score: Callable, *, n: int, width: int,
                max_steps: int, how: str) -> list[str]:
    """Step-level beam search: per question about `n` candidate steps a step, the PRM keeps the best `width`.

    `score(prompts, paths)` returns the PRM's line scores of each path. A kept
    terminal line finishes a path; the search of a question ends with `width`
    finished paths, no live beam, or `max_steps` lines. The answer is the
    finished path with the best aggregated score (`how`).
    """
    beams: list[list[tuple[Path, list[float]]]] = [[((), [])] for _ in prompts]
    heads = [policy.render(p) for p in prompts]
    finished: list[list[tuple[Path, list[float]]]] = [[] for _ in prompts]
    for depth in range(max_steps):
        work = [(i, path, scores) for i, bs in enumerate(beams) for path, scores in bs]
        if not work:
            break
        per_beam = n if depth == 0 else max(1, n // width)
        sampled = policy.next_lines([prefix(heads[i], path) for i, path, _ in work], per_beam)
        candidates: dict[int, dict[Path, bool]] = {}
        for (i, path, _), lines in zip(work, sampled):
            for line in lines:
                candidates.setdefault(i, {}).setdefault(path + (line.text,), line.terminal or depth + 1 >= max_steps)
        flat = [(i, path, terminal) for i, paths in candidates.items() for path, terminal in paths.items()]
        line_scores = score([prompts[i] for i, _, _ in flat], [scored(path) for _, path, _ in flat])
        by_question: dict[int, list] = {}
        for (i, path, terminal), scores in zip(flat, line_scores):
            by_question.setdefault(i, []).append((aggregate(scores, "last"), path, terminal, scores))
        for i in range(len(prompts)):
            kept = sorted(by_question.get(i, []), key=lambda c: -c[0])[:width]
            beams[i] = [(path, scores) for _, path, terminal, scores in kept if not terminal]
            finished[i] += [(path, scores) for _, path, terminal, scores in kept if terminal]
            if len(finished[i]) >= width:
                beams[i] = []
    # At the last depth every kept line is terminal, so a question with any candidate has finished paths.
    return [completion(max(done, key=lambda d: aggregate(d[1], how))[0]) if done else "" for done in finished]


def prm_mcts(prompts: Sequence[str], policy: StepPolicy, score: Callable, *, iterations: int, children: int,
             c: float, max_steps: int) -> list[str]:
    """PRM-MCTS: the PRM's score of a new line replaces the rollout; the answer is `best_terminal`'s path.

    A tree without a terminal node completes its best path (highest mean score) greedily.
    """
    def evaluate(owners: list[int], nodes: list[Node]) -> list[float]:
        scores = score([prompts[i] for i in owners], [scored(node.lines) for node in nodes])
        return [aggregate(s, "last") for s in scores]

    roots = mcts(prompts, policy, evaluate, iterations=iterations, children=children, c=c, max_steps=max_steps)
    answers: list[str] = [""] * len(prompts)
    unfinished = []
    for i, root in enumerate(roots):
        best = best_terminal(root)
        if best is not None:
            answers[i] = completion(best.lines)
            continue
        nodes = [node for node in root.walk() if node.parent is not None]
        if nodes:
            unfinished.append((i, max(nodes, key=mean_value).lines))
    for (i, path), rest in zip(unfinished,
                               policy.complete([prefix(policy.render(prompts[i]), p) for i, p in unfinished])):
        answers[i] = prefix("", path) + rest
    return answers


def rollout_evaluator(prompts: Sequence[str], policy: StepPolicy, reward: Callable[[int, str], float]) -> Evaluator:
    """PROPA's node value: the reward of the node's terminal line, or of a greedy rollout from it.

    `reward(question index, completion text)` grades a whole completion.
    """
    heads = [policy.render(p) for p in prompts]

    def evaluate(owners: list[int], nodes: list[Node]) -> list[float]:
        values = [reward(i, completion(node.lines)) if node.terminal else None for i, node in zip(owners, nodes)]
        todo = [k for k, v in enumerate(values) if v is None]
        rests = policy.complete([prefix(heads[owners[k]], nodes[k].lines) for k in todo])
        for k, rest in zip(todo, rests):
            values[k] = reward(owners[k], prefix("", nodes[k].lines) + rest)
        return values

    return evaluate


def tree_paths(root: Node) -> list[tuple[Path, list[float]]]:
    """One (lines as the PRM reads them, Q of every node on the path) per leaf: every visited node's Q appears in
    some row."""
    return [(scored(leaf.lines), [n.q for n in leaf.path()])
            for leaf in root.walk() if leaf.parent is not None and not leaf.children]
