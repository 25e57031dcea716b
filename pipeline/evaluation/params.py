"""The evaluation room's params: `evaluate` and its PRM-guided `decoding`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.params import Section


class DecodingConfig(Section):
    """`evaluate.decoding`: decoding strategies at one sample budget N, on the first `questions` of each split.

    Whole samples are the pass@k samples (max(k, N) are drawn at `k_temperature`, so
    `questions` is at most `k_samples`); beam search and PRM-MCTS sample lines at the
    same temperature.
    """

    strategies: list[Literal["greedy", "maj_at_n", "prm_best_of_n", "prm_weighted_vote", "prm_beam",
                             "prm_mcts"]] = Field(
        ["greedy", "maj_at_n", "prm_best_of_n", "prm_weighted_vote", "prm_beam", "prm_mcts"],
        description="strategies reported"
    )
    prm: Literal["prm"] | None = Field("prm", description="the PRM under models/ (the prm stage's, a DVC dependency "
                                       "of evaluate; null: no PRM strategies)")
    questions: int = Field(300, ge=1, description="questions per split, the first N (all strategies on the same "
                           "ones; why: study `best-of-n-on-500-questions`)")
    n: int = Field(8, ge=1, description="N: whole samples (maj@N, best-of-N), candidate lines per beam-search step "
                   "(why: study `best-of-8`)")
    aggregation: Literal["min", "last", "mean"] = Field(
        "mean", description="best-of-N and beam search's final pick: a solution's score from its lines (chosen on "
        "val: studies `best-of-n-on-500-questions`, `best-of-8`)")
    vote_aggregation: Literal["min", "last", "mean"] = Field(
        "min", description="the PRM-weighted vote: a sample's weight from its lines (Math-Shepherd's weighted "
        "self-consistency takes the minimum; study `best-of-8-sign-between-seeds`)")
    search_questions: int | None = Field(50, ge=1, description="beam search and PRM-MCTS: on the first N of the "
                                         "`questions` only, each then compared with greedy on those (null: all)")
    beam_width: int = Field(2, ge=1, description="beam search: paths kept per step")
    mcts_iterations: int = Field(12, ge=1, description="PRM-MCTS: iterations per question")
    mcts_children: int = Field(2, ge=1, description="PRM-MCTS: candidate lines per expansion")
    ucb_c: float = Field(1.0, ge=0, description="PRM-MCTS: UCB exploration constant")
    max_steps: int = Field(8, ge=1, description="beam search and PRM-MCTS: lines per solution at most")
    step_tokens: int = Field(64, ge=1, description="token limit of one sampled line; a paragraph step may run to "
                             "evaluate.max_new_tokens")
    prm_batch_size: int = Field(64, ge=1, description="paths the PRM scores together")
    step_batch_size: int = Field(512, ge=1, description="beam search and PRM-MCTS: lines sampled together")

    @model_validator(mode="after")
    def _beam(self) -> "DecodingConfig":
        if self.beam_width > self.n:
            raise ValueError("beam_width must be <= n (each step samples n candidate lines in all)")
        if self.prm is None and (guided := [s for s in self.strategies if s.startswith("prm_")]):
            raise ValueError(f"strategies: {', '.join(guided)} need a PRM; prm is null (drop them, or set prm: prm)")
        return self


class EvaluateConfig(Section):
    """`evaluate`: batched greedy generation on test and ood, graded per question; PRM-guided decoding."""

    batch_size: int = Field(256, ge=1, description="sequences generated together (greedy: questions; sampled: "
                            "questions x samples)")
    max_new_tokens: int = Field(128, ge=1, description="generation limit per question, in tokens")
    max_samples: int | None = Field(None, ge=1, description="evaluate only the first N questions of each split")
    splits: list[Literal["test", "ood", "val"]] = Field(["test", "ood"], min_length=1, description="splits to evaluate")
    sampled_splits: list[Literal["test", "ood", "val"]] = Field(
        ["test"], description="splits that also get the k samples (pass@k, maj@k) and the decoding strategies; "
        "the other splits are decoded greedily only")
    k: int = Field(4, ge=1, description="pass@k and maj@k: samples per question")
    k_samples: int | None = Field(300, ge=1, description="pass@k and maj@k: on the first N questions of each split")
    k_temperature: float = Field(0.8, gt=0, description="pass@k and maj@k: sampling temperature")
    decoding: DecodingConfig = Field(default_factory=DecodingConfig, description="PRM-guided decoding")

    @model_validator(mode="after")
    def _decoding_questions(self) -> "EvaluateConfig":
        if self.k_samples is not None and self.decoding.questions > self.k_samples:
            raise ValueError("decoding.questions must be <= k_samples (the strategies reuse the pass@k samples)")
        if not set(self.sampled_splits) <= set(self.splits):
            raise ValueError("sampled_splits must be among splits")
        if "test" not in self.splits:  # the flat metrics (accuracy, questions) are test's, as dvc metrics diff reads
            raise ValueError("splits: must include test (the headline metrics); add ood or val beside it")
        return self
