"""The data room's params: `synthesize` (the chart generator), `task` and its `dataset` (a user's
dataset), `distill`, `mine` (hard cases) and `animate` (image-to-video).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.io import ConfigError
from pipeline.core.paths import SPLITS
from pipeline.core.params import LOCAL_RULE, PARAMS_FILE, Section, is_local, watched


ChartType = Literal["bar", "grouped_bar", "stacked_bar", "line", "pie"]


AnswerType = Literal["number", "binary", "text"]


class SynthesizeConfig(Section):
    """`synthesize`: the Chain-of-Functions generator."""

    seed: int = Field(0, ge=0, description="RNG seed; the same seed gives byte-identical files")
    n_train: int = Field(6000, ge=1, description="training questions")
    n_val: int = Field(300, ge=1, description="validation questions (in-domain)")
    n_test: int = Field(500, ge=1, description="test questions (in-domain)")
    n_ood: int = Field(300, ge=0, description="out-of-domain questions (held-out chain lengths / function pairs)")
    chart_types: list[ChartType] = Field(
        ["bar", "line", "pie"], min_length=1, description="chart types to draw tables for"
    )
    min_categories: int = Field(3, ge=2, description="fewest categories (x labels / slices) in a table")
    max_categories: int = Field(4, ge=2, le=12, description="most categories in a table")
    max_series: int = Field(1, ge=1, le=6, description="most series (legend entries) in a multi-series chart "
                            "(why the default is narrow: study `narrow-default-distribution`)")
    value_min: int = Field(1, ge=0, description="smallest table value")
    value_max: int = Field(20, ge=2, description="largest table value")
    min_chain_length: int = Field(2, ge=2, description="shortest chain (functions) in any split")
    max_chain_length: int = Field(3, ge=2, description="longest chain in train/val/test")
    ood_min_chain_length: int = Field(4, ge=3, description="ood chains are at least this long (never seen in train)")
    ood_max_chain_length: int = Field(5, ge=3, description="longest ood chain")
    max_subchains: int = Field(3, ge=1, le=3, description="sub-chains joined by binary value operators")
    ood_held_out_pairs: list[str] = Field(
        default_factory=list,
        description="function bigrams 'f>g' that only ever appear in ood (function combinations unseen in train)",
    )
    answer_type_weights: dict[AnswerType, float] = Field(
        {"number": 0.68, "binary": 0.16, "text": 0.16}, description="target share of each answer type"
    )
    render_charts: int = Field(20, ge=0, description="charts rendered to PNG per split (the first N questions)")
    max_attempts_factor: int = Field(200, ge=1, description="give up after this many attempts per requested question")
    block_size: int = Field(1000, ge=1, description="questions per block: each block draws from its own seed, so "
                            "blocks run in parallel (changing it changes the rows)")
    workers: int = Field(1, ge=1, description="processes that draw the blocks, the stage's own among them (at most "
                         "one per block); the output does not depend on it")

    @model_validator(mode="after")
    def _ranges(self) -> "SynthesizeConfig":
        if self.min_categories > self.max_categories:
            raise ValueError("min_categories must be <= max_categories")
        if self.value_min >= self.value_max:
            raise ValueError("value_min must be < value_max")
        if self.min_chain_length > self.max_chain_length:
            raise ValueError("min_chain_length must be <= max_chain_length")
        if self.n_ood and not (self.max_chain_length < self.ood_min_chain_length <= self.ood_max_chain_length):
            raise ValueError("need max_chain_length < ood_min_chain_length <= ood_max_chain_length")
        if any(w < 0 for w in self.answer_type_weights.values()) or not sum(self.answer_type_weights.values()) > 0:
            raise ValueError("answer_type_weights: shares must be >= 0 with a positive sum (leave a type out to drop "
                             "it)")
        # the shape here; the function names by the generator's own check (validate_all, and the stage)
        for pair in self.ood_held_out_pairs:
            if pair.count(">") != 1:
                raise ValueError(f"ood_held_out_pairs: {pair!r} is not 'f>g' with known functions")
        return self


class DistillConfig(Section):
    """`distill`: rejection sampling of teacher traces, difficulty by pass rate, dedup and decontamination."""

    seed: int = Field(0, ge=0, description="sampling seed")
    method: Literal["traces", "logits"] = Field(
        "traces",
        description="traces: SFT on verified traces only; logits: the sft stage adds on-policy logit distillation "
        "with TRL's DistillationTrainer (teacher and student must share a tokenizer)",
    )
    max_questions: int | None = Field(200, ge=1, description="training questions sent to the teacher (null: all)")
    shots: int = Field(0, ge=0, description="worked examples (the gold rationales of the first clean training "
                       "questions, which are then not sampled) shown before every question: few-shot prompting, "
                       "as STaR samples its rationales (0: none)")
    k: int = Field(4, ge=1, description="samples per question (the pass rate is correct / k)")
    temperature: float = Field(0.6, gt=0, description="sampling temperature")
    top_p: float = Field(0.95, gt=0, le=1, description="nucleus sampling")
    max_new_tokens: int = Field(128, ge=1, description="generation limit per trace, in tokens")
    batch_size: int = Field(512, ge=1, description="local backends: sequences generated together")
    max_traces: int = Field(2, ge=1, description="verified traces kept per question (M)")
    min_step_accuracy: float = Field(
        1.0, ge=0, le=1, description="a correct answer also needs this share of gold step values in its `Step k:` lines"
    )
    hard_min_pass_rate: float = Field(0.2, ge=0, le=1, description="hard set: lowest pass rate (inclusive)")
    hard_max_pass_rate: float = Field(0.625, ge=0, le=1, description="hard set: highest pass rate (inclusive)")
    near_duplicate_threshold: float = Field(
        0.9, gt=0, le=1, description="drop a trace whose word-trigram Jaccard similarity to a kept one is at least this"
    )
    ngram: int = Field(8, ge=1, description="decontamination: drop questions sharing a word n-gram with val/test/ood")
    logit_steps: int = Field(100, ge=1, description="logits: on-policy distillation steps after SFT")
    logit_beta: float = Field(0.5, ge=0, le=1, description="logits: 0 forward KL, 0.5 JSD, 1 reverse KL")
    logit_learning_rate: float = Field(3e-4, gt=0, lt=1, description="logits: peak learning rate")
    logit_max_new_tokens: int = Field(96, ge=1, description="logits: student rollout length")
    logit_temperature: float = Field(1.0, gt=0, description="logits: rollout and softmax temperature")

    @model_validator(mode="after")
    def _window(self) -> "DistillConfig":
        if self.hard_min_pass_rate > self.hard_max_pass_rate:
            raise ValueError("hard_min_pass_rate must be <= hard_max_pass_rate")
        if self.max_traces > self.k:
            raise ValueError("max_traces must be <= k")
        return self


class MineConfig(Section):
    """`mine`: hard-case mining. G rollouts per RL-pool prompt from the SFT policy give each prompt a pass rate."""

    seed: int = Field(0, ge=0, description="sampling seed and pool order")
    pool_size: int = Field(200, ge=1, description="training questions in the RL pool")
    rollouts: int = Field(8, ge=2, description="G: sampled completions per prompt")
    temperature: float = Field(0.8, gt=0, description="sampling temperature (the GRPO rollout temperature)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling")
    max_new_tokens: int = Field(128, ge=1, description="generation limit per rollout, in tokens")
    batch_size: int = Field(512, ge=1, description="sequences generated together")
    hard_min_pass_rate: float = Field(0.125, ge=0, le=1, description="hard bucket: lowest pass rate (inclusive)")
    hard_max_pass_rate: float = Field(0.625, ge=0, le=1, description="hard bucket: highest pass rate (inclusive)")
    repeat_unsolved: int = Field(1, ge=0, description="copies in the RL set of a prompt no rollout solved (0: exclude)")
    repeat_hard: int = Field(2, ge=0, description="copies of a hard prompt (oversampling)")
    repeat_easy: int = Field(1, ge=0, description="copies of a prompt above the hard window but not always solved")
    repeat_solved: int = Field(0, ge=0, description="copies of a prompt every rollout solved (0: exclude, no signal)")
    max_pairs_per_prompt: int = Field(1, ge=1, description="on-policy preference pairs (correct vs incorrect) "
                                      "per prompt")

    @model_validator(mode="after")
    def _window(self) -> "MineConfig":
        if self.hard_min_pass_rate > self.hard_max_pass_rate:
            raise ValueError("hard_min_pass_rate must be <= hard_max_pass_rate")
        if not (self.repeat_unsolved or self.repeat_hard or self.repeat_easy or self.repeat_solved):
            raise ValueError("repeat_unsolved, repeat_hard, repeat_easy and repeat_solved are all 0: the RL set would "
                             "be empty whatever the policy solves")
        return self


EditOp = Literal["highlight", "recolour", "remove", "annotate", "change_value"]


class AnimateConfig(Section):
    """`animate`: chart images to paired source/target video-edit clips, filters and temporal questions."""

    seed: int = Field(0, ge=0, description="RNG seed; with the procedural backend the same seed gives byte-identical "
                      "clips")
    backend: Literal["procedural", "diffusers"] = Field(
        "procedural", description="procedural: camera and data dynamics redrawn on CPU; diffusers: an image-to-video "
        "pipeline (Stable Video Diffusion, CogVideoX-I2V) from model_path, on GPU (pip install -e '.[video]')",
    )
    model_path: str | None = Field(None, description="diffusers: local folder of the pipeline (with model_index.json)")
    device: str = Field("cuda", description="diffusers: torch device")
    dtype: Literal["float16", "bfloat16", "float32"] = Field("float16", description="diffusers: weight dtype")
    num_inference_steps: int = Field(25, ge=1, description="diffusers: denoising steps per clip")
    samples: int = Field(12, ge=1, description="training tables turned into samples (the first N rows of train)")
    frames: int = Field(16, ge=2, description="frames per clip")
    fps: int = Field(8, ge=1, le=60, description="frames per second of the MP4 files")
    width: int = Field(320, ge=64, description="frame width in pixels (even: H.264 4:2:0)")
    height: int = Field(240, ge=64, description="frame height in pixels (even)")
    crf: int = Field(18, ge=0, le=51, description="x264 constant rate factor (lower: larger files, closer "
                     "to the frames)")
    edit_ops: dict[EditOp, float] = Field(
        {"highlight": 1.0, "recolour": 1.0, "remove": 1.0, "annotate": 1.0, "change_value": 1.0},
        min_length=1, description="edit operation -> sampling weight",
    )
    max_zoom: float = Field(0.15, ge=0, le=1, description="camera: end zoom drawn from [1 - max/2, 1 + max]")
    max_pan: float = Field(0.06, ge=0, le=0.5, description="camera: end pan, a share of the width / height")
    max_rotation: float = Field(3.0, ge=0, le=45, description="camera: end rotation in degrees, either way")
    value_drift: float = Field(0.5, ge=0, le=2, description="data dynamics: each value moves by up to this share of "
                               "the table's largest value")
    mask_margin: int = Field(3, ge=0, description="pixels added around each edited mark's box (anti-aliasing, "
                             "outlines)")
    min_temporal_ssim: float = Field(0.6, ge=-1, le=1, description="filter: lowest SSIM allowed between "
                                     "consecutive frames")
    min_motion: float = Field(1.0, ge=0, description="filter: least mean change of 2x2 block-averaged luma between "
                              "consecutive frames (0-255)")
    min_preserved_psnr: float = Field(35.0, ge=0, description="filter: least PSNR (dB) between source and target "
                                      "outside the edit")
    min_preserved_ssim: float = Field(0.98, ge=-1, le=1, description="filter: least SSIM between source and target "
                                      "outside the edit")
    max_edited_area: float = Field(0.6, gt=0, le=1, description="filter: largest share of the frame the edit mask "
                                   "may cover")
    questions_per_sample: int = Field(2, ge=0, le=4, description="temporal questions per kept sample (distinct chains)")
    question_frames: int = Field(5, ge=2, description="frames listed in a temporal question (evenly spaced, first "
                                 "and last)")
    contact_sheet: int = Field(6, ge=0, description="kept samples shown in the contact sheet (0: none); the first one "
                               "also as a GIF")

    @model_validator(mode="after")
    def _shape(self) -> "AnimateConfig":
        if self.width % 2 or self.height % 2:
            raise ValueError("width and height must be even (H.264 4:2:0)")
        if self.backend == "diffusers" and not self.model_path:
            raise ValueError("backend diffusers needs `model_path` (a local diffusers pipeline folder)")
        if not any(w > 0 for w in self.edit_ops.values()):
            raise ValueError("edit_ops needs a positive weight")
        return self


class DatasetConfig(Section):
    """`task.dataset`: a user's dataset, read by `pipeline.data.task_data`."""

    path: str = Field(..., min_length=1, description="a local parquet, JSONL or CSV file or folder, or a Hugging "
                      "Face dataset id")
    name: str | None = Field(None, description="the Hub dataset's config (GSM8K: main)")
    revision: str | None = Field(None, description="the Hub dataset's commit, tag or branch (pin it)")
    splits: dict[str, str] = Field(default_factory=dict, description="our split (train, val, test, ood) -> the "
                                   "dataset's split or, for a folder, file stem; empty: by the words in their names "
                                   "(gsm8k-train.jsonl: train; dev, valid, validation: val; eval: test)")
    prompt_field: str = Field("question", min_length=1, description="the column holding the prompt")
    answer_field: str = Field("answer", min_length=1, description="the column holding the answer")
    rationale_field: str | None = Field(None, description="the column holding a worked solution (null: none)")
    answer_extraction: Literal["field", "gsm8k", "boxed", "regex"] = Field(
        "field", description="how the answer comes out of answer_field: as it is; GSM8K's text after `####` (the "
        "text before it is the rationale); MATH's last \\boxed{}; the first group of answer_regex's last match")
    answer_regex: str | None = Field(None, description="answer_extraction regex: the first group of its last match "
                                     "is the answer (the whole match without a group)")
    test_fraction: float = Field(0.1, ge=0, lt=1, description="a missing test split: this share of train, chosen by "
                                 "a hash of the prompt (a single file is all train)")
    val_fraction: float = Field(0.05, ge=0, lt=1, description="a missing val split: this share of train (after the "
                                "test cut), chosen by a hash of the prompt")
    max_unextractable: float = Field(0.01, ge=0, le=1, description="share of rows whose answer cannot be extracted "
                                     "(quarantined) above which reading fails")

    @model_validator(mode="after")
    def _our_splits(self) -> "DatasetConfig":
        # at validation, before `dvc repro` deletes the data stage's outputs (the dataset's own names are checked
        # when it is read)
        if unknown := [ours for ours in self.splits if ours not in SPLITS]:
            raise ValueError(f"splits: {', '.join(unknown)}: not one of our splits ({', '.join(SPLITS)}); each key "
                             "is ours, each value the dataset's split or file stem")
        return self

    @model_validator(mode="after")
    def _regex_given(self) -> "DatasetConfig":
        if self.answer_extraction == "regex":
            if not self.answer_regex:
                raise ValueError("answer_regex: required when answer_extraction is regex")
            try:
                re.compile(self.answer_regex)
            except re.error as exc:
                raise ValueError(f"answer_regex: not a regular expression ({exc})") from None
        return self


# What `task.data_dependency` holds when there is no local dataset file to watch: a file every checkout has (the
# dataset reader, already among the data stage's code dependencies), so the DVC dependency always resolves.
NO_DATA_DEPENDENCY = "pipeline/data/task_data.py"


def is_local_dataset(path: str) -> bool:
    """Does `task.dataset.path` name a local file or folder (rather than a Hugging Face dataset id)?"""
    return is_local(path, (".parquet", ".jsonl", ".json", ".csv"))


def data_dependency_for(dataset_path: str | None) -> str:
    """`task.data_dependency` for a dataset path: the path itself when local (`~` expanded: DVC does not expand it),
    else `NO_DATA_DEPENDENCY`."""
    if dataset_path is None or not is_local_dataset(dataset_path):
        return NO_DATA_DEPENDENCY
    return watched(dataset_path)


class TaskConfig(Section):
    """`task`: the questions (the CoF charts or your dataset), how an answer is stated and graded, what a step is."""

    kind: Literal["cof", "dataset"] = Field(
        "cof", description="cof: the chart questions `synthesize` generates; dataset: `task.dataset` (the chart-only "
        "stages and drills are then skipped, each saying so in its log)")
    dataset: DatasetConfig | None = Field(None, description="dataset: where the questions come from and how their "
                                          "fields read (null for cof)")
    data_dependency: str = Field(
        NO_DATA_DEPENDENCY, min_length=1, description="the file or folder DVC watches for `synthesize`: a local "
        "dataset's path (written by `python -m pipeline params`; keep it equal to task.dataset.path), else "
        f"{NO_DATA_DEPENDENCY}")
    answer_format: Literal["answer_line", "boxed", "gsm8k", "last_number"] = Field(
        "answer_line", description="how a completion states its answer: a last line `Answer: x`; \\boxed{x}; "
        "`#### x`; the last number written. Text inside <think>...</think> is never read as the answer")
    grader: Literal["relaxed", "exact", "math_verify"] = Field(
        "relaxed", description="relaxed: numbers within 5%, text after case folding (ChartQA); exact: equal numbers "
        "or the same text; math_verify: LaTeX and symbolic equivalence (Hugging Face's math-verify)")
    step_split: Literal["line", "paragraph"] = Field(
        "line", description="what one reasoning step is, for the PRM, step search and step labels (cof: its "
        "`Step k:` lines)")
    @model_validator(mode="after")
    def _kind(self) -> "TaskConfig":
        if self.kind == "cof":
            if self.dataset is not None:
                raise ValueError("dataset: must be null for kind cof (set kind: dataset to read it)")
            if self.answer_format != "answer_line" or self.step_split != "line":
                raise ValueError("kind cof writes `Step k:` lines and an `Answer:` line: answer_format must be "
                                 "answer_line and step_split line")
        elif self.dataset is None:
            raise ValueError("dataset: required for kind dataset (at least dataset.path)")
        want = data_dependency_for(self.dataset.path if self.dataset is not None else None)
        if self.data_dependency != want:
            raise ValueError(f"data_dependency: must be {want!r} (the local dataset DVC watches, else "
                             f"{NO_DATA_DEPENDENCY}); `python -m pipeline params --write` sets it")
        return self


