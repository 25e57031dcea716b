"""The PRM room's params: `prm_data` (labelled steps) and `prm` (the process reward model's training).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.core.params import Scheduler, Section, TRLSection, trl_args_field
from pipeline.core.registry import EVALUATED


class PRMDataConfig(Section):
    """`prm_data`: step labels for the PRM, from the CoF gold values and from PROPA's MCTS with the policy."""

    seed: int = Field(0, ge=0, description="question sample and sampling seed")
    # a model stage upstream of prm_data (models/<policy> is its DVC dependency): not prm itself, which it feeds
    policy: Literal[EVALUATED] = Field(  # type: ignore[valid-type]
        "sft", description="the policy under models/ whose steps are labelled (and the PRM starts from)")
    question_seed: int = Field(1, ge=0, description="the CoF generator's seed for the new training questions (not "
                               "synthesize.seed)")
    gold_questions: int = Field(3000, ge=1, description="gold labels: new training questions (why: studies "
                                "`quick-default`, `quick-default-under-ten-minutes`, `a-teacher-that-teaches`)")
    val_questions: int = Field(200, ge=0, description="gold labels on validation questions: the PRM's held-out set")
    samples: int = Field(4, ge=1, description="gold labels: policy completions per question")
    mc_rollouts: int = Field(4, ge=1, description="a dataset task (no gold step values): completions sampled after "
                             "each step, its label the share that reach the right answer (Math-Shepherd)")
    temperature: float = Field(0.8, gt=0, description="gold labels: sampling temperature")
    max_new_tokens: int = Field(128, ge=1, description="generation limit per completion or rollout, in tokens")
    batch_size: int = Field(512, ge=1, description="sequences generated together")
    mcts_questions: int = Field(20, ge=0, description="MCTS labels: other new questions searched (0: gold labels only)")
    chain_questions: int = Field(0, ge=0, description="more new questions that give only their gold chain "
                                 "(chains.parquet holds the chains of every new question; why: study "
                                 "`prm-gold-chains-12000-and-24000`)")
    iterations: int = Field(8, ge=1, description="MCTS iterations per question (PROPA: 20)")
    children: int = Field(4, ge=1, description="candidate next steps per expansion")
    ucb_c: float = Field(1.0, ge=0, description="UCB exploration constant")
    expand_temperature: float = Field(1.2, gt=0, description="expansion sampling temperature")
    expand_top_k: int = Field(50, ge=0, description="expansion top-k (0: off)")
    expand_top_p: float = Field(0.95, gt=0, le=1, description="expansion nucleus sampling")
    step_tokens: int = Field(64, ge=1, description="token limit of one sampled line (PROPA: 128); a paragraph "
                             "step may run to max_new_tokens")
    max_steps: int = Field(8, ge=1, description="lines below the root before a path counts as terminal")


class PRMConfig(TRLSection):
    """`prm`: the process reward model, the policy's LM read as a verdict on every token of a line."""

    TRL_CONFIG = "transformers:TrainingArguments"

    seed: int = Field(0, ge=0, description="RNG seed for the data order")
    sources: list[Literal["gold", "mcts", "mc"]] = Field(
        ["gold", "mcts"], min_length=1, description="label sources trained on (gold: BCE on 0/1, mcts: MSE on "
        "log_boost; mc, a dataset task's labels: BCE on the share of rollouts that reach the right answer)"
    )
    chain_weight: float = Field(1.0, ge=0, description="weight of next-token cross-entropy on the gold chains of "
                                "data/prm_data/chains.parquet (0: no chains; why: study `prm-writes-gold-chains`)")
    contrast: int = Field(0, ge=0, description="contrast paths from the gold chains of data/prm_data/chains.parquet: "
                          "at each choice step (a largest, a subset, a Yes/No, a count) the chain cut there, and up "
                          "to this many copies with a wrong choice (pipeline/prm/contrast.py; 0: none)")
    pair_weight: float = Field(0.0, ge=0, description="weight of the within-question ranking loss: a right path's "
                               "mean line score above a wrong one's of the same question (0: off; tried: study "
                               "`ranking-drill-with-digit-pairs`)")
    extra_layers: int = Field(0, ge=0, description="decoder layers added on top of the policy's, each starting as "
                              "the identity (tried: study `prm-writes-gold-chains`)")
    learning_rate: float = Field(2e-3, gt=0, lt=1, description="peak learning rate")
    lr_scheduler_type: Scheduler = Field("cosine", description="learning-rate schedule")
    warmup_steps: float = Field(0.05, ge=0, description="linear warm-up (share of steps when < 1)")
    num_train_epochs: float = Field(1.5, gt=0, description="passes over the labelled paths (why: studies "
                                    "`prm-contrast-paths`, `prm-epochs-and-length-grouping`, `quick-default`, "
                                    "`quick-default-under-ten-minutes`)")
    per_device_train_batch_size: int = Field(32, ge=1, description="labelled paths per optimizer step")
    group_by_length: bool = Field(False, description="batch paths of similar length (transformers' length-grouped "
                                  "sampler: less padding); not with pair_weight, whose batches hold a question's "
                                  "paths (measured: study `prm-epochs-and-length-grouping`)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    max_length: int = Field(512, ge=16, description="paths longer than this many tokens are left out (counted)")
    logging_steps: int = Field(20, ge=1, description="log the training loss every N steps")
    batch_size: int = Field(64, ge=1, description="paths scored together when measuring held-out AUROC")
    trl_args: dict[str, Any] = trl_args_field(TRL_CONFIG)
