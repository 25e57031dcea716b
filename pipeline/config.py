"""Typed params: one pydantic model per `params.yaml` section.

A stage calls `load_section("sft", SFTConfig)`; an unknown key, a wrong type or
an out-of-range value raises `ConfigError` naming the key before any work starts,
e.g. ``params.yaml: sft.learning_rat: unknown key``.
"""

from __future__ import annotations

import os
import re
import types
import typing
from functools import lru_cache, reduce
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.core.io import ConfigError
from pipeline.core.paths import PRETRAINED, SPLITS
from pipeline.core.registry import EVALUATED, TRAINING_STAGES

PARAMS_FILE = "params.yaml"


class Section(BaseModel):
    """Base of every params section: unknown keys fail, values are checked on assignment, and no number is NaN or
    infinite (a NaN reward weight would zero every reward and train nothing, without a word)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value, info):
        """pydantic reads true as 1 for a number: `-S sft.seed=true` would run seed 1 without a word."""
        if (below := _boolean_for_number(cls.model_fields[info.field_name].annotation, value)) is not None:
            raise BooleanForNumber(below, reduce(lambda held, key: held[key], below, value))
        return value


class BooleanForNumber(ValueError):
    """A boolean where a number belongs; `below` the keys or indices under the field that hold it (the error
    message names the whole dotted key: `rewards.weights.accuracy`)."""

    def __init__(self, below: tuple, found: bool) -> None:
        super().__init__("must be a number, not a boolean")
        self.below, self.found = below, found


def _bare(annotation):
    """A type without its `Annotated[...]` constraints (pydantic strips only the outermost)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _boolean_for_number(annotation, value) -> tuple | None:
    """Where `value` holds a boolean that the field's type wants as a number: () for the value itself, a key or
    index path for a mapping's value or a list's or tuple's item; None where it holds none. Through unions (one
    that offers bool takes it as it is) and `Annotated` constraints."""
    annotation = _bare(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [_bare(a) for a in args]
        if isinstance(value, bool) and bool in options:
            return None
        return next((found for a in options if (found := _boolean_for_number(a, value)) is not None), None)
    if isinstance(value, bool):
        return () if annotation in (int, float) else None
    if origin in (list, tuple) and args and isinstance(value, list | tuple):
        items = args if origin is tuple and Ellipsis not in args else args[:1] * len(value)
        pairs = zip(range(len(value)), items, value)
    elif origin is dict and len(args) == 2 and isinstance(value, dict):
        pairs = ((key, args[1], v) for key, v in value.items())
    else:
        return None
    return next(((key, *found) for key, a, v in pairs if (found := _boolean_for_number(a, v)) is not None), None)


ChartType = Literal["bar", "grouped_bar", "stacked_bar", "line", "pie"]
AnswerType = Literal["number", "binary", "text"]
Scheduler = Literal["linear", "cosine", "constant", "constant_with_warmup"]


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


def check_heads(cfg: "BaseModelConfig | TeacherConfig") -> None:
    """Attention shapes a Qwen2 can build: heads divide the width, key/value heads divide the heads."""
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError("hidden_size must be divisible by num_attention_heads")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError("num_attention_heads must be divisible by num_key_value_heads")


class DrillConfig(Section):
    """`base.drills`: table-reading drills a student built from scratch trains on before SFT
    (pipeline/training/drills.py)."""

    seed: int = Field(0, ge=0, description="RNG seed of the random tables and the keys asked")
    colour_steps: int = Field(6000, ge=0, description="most steps of every key asked in turn, values as colour words "
                              "(0: skip)")
    number_steps: int = Field(3000, ge=0, description="most steps of the numbers drill, the chart's own table line "
                              "(0: skip)")
    number_task: Literal["multi", "lookup"] = Field(
        "multi", description="numbers drill: multi asks every key of a table in turn, lookup one key (multi learns "
        "the lookup from more inits: study `drills-until-they-read`)")
    check_every: int = Field(250, ge=0, description="steps between checks of a drill on its check tables; it stops "
                             "once they read `stop_at` (0: every step is run)")
    check_tables: int = Field(100, ge=1, description="held-out random tables the checks ask (others than `val_tables`)")
    stop_at: float = Field(0.98, ge=0, le=1, description="check tables' exact match at which a drill stops")
    learning_rate: float = Field(1e-3, gt=0, lt=1, description="peak AdamW learning rate (5% warm-up, cosine over "
                                 "the most steps, so a drill that stops early stops at a high rate)")
    batch_size: int = Field(16, ge=1, description="drills per optimizer step")
    val_tables: int = Field(200, ge=1, description="held-out random tables the exact-match metrics ask")
    gate: float = Field(0.9, ge=0, le=1, description="numbers drill: held-out exact match an init should reach; "
                        "below it the stage warns and, with `restarts`, drills the next init (seed + 1) (why: study "
                        "`numeric-lookup-clicks`)")
    restarts: int = Field(0, ge=0, description="more inits tried when one misses `gate` (each a full drill run; 0: "
                          "one init, whatever it reads)")


class RankDrillConfig(Section):
    """`sft.rank_drill`: the ranking drill the student trains on after SFT (pipeline/training/drills.py), so that every
    policy after `sft` and the PRM started from it rank a listed set."""

    seed: int = Field(0, ge=0, description="RNG seed of the random tables and the ranks asked")
    curriculum: list[Annotated[int, Field(ge=0)]] = Field(
        [], max_length=3, description="steps of each phase before `steps`: phase i asks only the first i + 1 "
        "ranks (largest; largest and smallest; + second largest); why: study `ranking-drill-curriculum-and-replay`")
    steps: int = Field(0, ge=0, description="optimizer steps on every rank, after the curriculum (0 and no "
                       "curriculum: no drill)")
    learning_rate: float = Field(1e-3, gt=0, lt=1, description="peak AdamW learning rate (5% warm-up, cosine)")
    batch_size: int = Field(16, ge=1, description="drills per optimizer step")
    replay: int = Field(8, ge=0, description="gold rows (synthesized prompt and rationale) added to each batch, so "
                        "that the policy keeps what the drill never asks (study `ranking-drill-curriculum-and-replay`)")
    val_tables: int = Field(200, ge=1, description="held-out random tables the exact-match metric asks")
    expect: float = Field(0.5, ge=0, le=1, description="held-out exact match below which the stage warns (a key "
                          "of the list at random reads about 0.29)")


# What `base.model_dependency` and `teacher.model_dependency` hold when no local model folder is loaded: a file both
# stages already list among their code dependencies, so the DVC dependency always resolves.
NO_MODEL_DEPENDENCY = "pipeline/modeling/models.py"
# Folders of this pipeline's own outputs: a model there is a stage's output, never a DVC dependency (a cycle)
PIPELINE_OUTPUTS = ("models", "data")


LOCAL_RULE = ("a local path: it exists, starts with . / or ~, has more than one /, its first folder exists here, or "
              "it is under pretrained/; a Hugging Face id is name or owner/name")


def is_local(path: str, suffixes: tuple[str, ...] = ()) -> bool:
    """Does a path-or-id name something local (rather than a Hugging Face id, owner/name)? It exists, starts with
    . / or ~, ends in one of `suffixes`, has more than one / (no Hub id does), or its first folder exists here:
    `examples/gsm8kk` is a mistyped local path, which would otherwise be looked up on the Hub, retried for half a
    minute offline, and then reported as a bad id."""
    if Path(path).expanduser().exists() or path.startswith((".", "/", "~")) or Path(path).suffix in suffixes:
        return True
    if Path(path).parts[:1] == PRETRAINED.parts:  # a model `python -m pipeline fetch` converts (not yet, here)
        return True
    if is_stage_output(path):  # models/base: a stage writes it (not yet, on a fresh clone)
        return True
    parts = path.split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


def is_stage_output(path: str) -> bool:
    """Does `path` name a folder a stage of this pipeline writes (under models/ or data/, relative)?"""
    parts = Path(path).parts
    return len(parts) > 1 and not Path(path).is_absolute() and parts[0] in PIPELINE_OUTPUTS


def watched(path: str) -> str:
    """A local path as DVC must be given it: `~` expanded (DVC does not expand it)."""
    return str(Path(path).expanduser()) if path.startswith("~") else path


def model_dependency_for(model: str | None) -> str:
    """The DVC dependency for a model path or id: its local folder, so that retraining it in place re-runs the
    stage that loads it; else `NO_MODEL_DEPENDENCY` (a Hub id, nothing loaded, or a folder inside this repository's
    models/ or data/, a stage's own output)."""
    if model is None or not is_local(model, (".gguf",)):
        return NO_MODEL_DEPENDENCY
    try:
        inside = Path(model).expanduser().resolve().relative_to(Path.cwd().resolve()).parts
    except ValueError:
        inside = ()
    return NO_MODEL_DEPENDENCY if inside and inside[0] in PIPELINE_OUTPUTS else watched(model)


def derive_model_dependency(section: "BaseModelConfig | TeacherConfig", loaded: str | None) -> None:
    """Set `model_dependency` from the loaded model when the params leave it out (code, tests); check it when they
    spell it out (params.yaml, where `python -m pipeline params` writes it)."""
    want = model_dependency_for(loaded)
    if "model_dependency" not in section.model_fields_set:
        section.model_dependency = want
    elif section.model_dependency != want:
        raise ValueError(f"model_dependency: must be {want!r} (the local model folder DVC watches, else "
                         f"{NO_MODEL_DEPENDENCY}); `python -m pipeline params --write` sets it")


class BaseModelConfig(Section):
    """`base`: the tokenizer and the student before SFT (built from scratch and drilled, or loaded)."""

    seed: int = Field(0, ge=0, description="RNG seed for weight init (every init tried learns the table reading in "
                      "drills that run until they read it: study `drills-until-they-read`)")
    model: str | None = Field(None, description="Hugging Face model path or id to load instead of building the "
                              "tiny default")
    model_dependency: str = Field(
        NO_MODEL_DEPENDENCY, min_length=1, description="the folder DVC watches for `base`: `model` when it is a local "
        "folder outside models/ and data/ (written by `python -m pipeline params`), else " + NO_MODEL_DEPENDENCY)
    vocab_size: int = Field(1024, ge=64, description="BPE vocabulary size asked of the trained tokenizer, in tokens "
                            "(an upper bound: a small corpus may have fewer merges)")
    digits: Literal["pairs", "spaced", "split"] = Field(
        "pairs", description="pairs: numbers cut into pieces of at most two digits with the space before them "
        "(' 19' one token; why: study `digit-pair-tokenizer`); spaced: one digit a piece (' 19' -> ' 1', '9'); "
        "split: the space a token of its own (' ', '1', '9')",
    )
    architecture: Literal["qwen2", "llama"] = Field(
        "llama", description="the built student's transformers architecture (both: RoPE, RMSNorm, SwiGLU, GQA; a "
        "qwen2 folder loads through AutoTokenizer as Qwen2Tokenizer, which re-splits the numbers: study "
        "`autotokenizer-reload-trap`)")
    hidden_size: int = Field(128, ge=16, description="hidden size")
    intermediate_size: int = Field(384, ge=16, description="MLP size")
    num_hidden_layers: int = Field(2, ge=1, description="transformer layers")
    num_attention_heads: int = Field(4, ge=1, description="attention heads")
    num_key_value_heads: int = Field(2, ge=1, description="key/value heads (GQA)")
    max_position_embeddings: int = Field(1024, ge=32, description="longest sequence in tokens")
    drills: DrillConfig = Field(
        default_factory=DrillConfig, description="table-reading drills before SFT (the built student only, not "
        "`model`; why: study `does-the-student-read-the-table`)"
    )

    @model_validator(mode="after")
    def _heads(self) -> "BaseModelConfig":
        check_heads(self)
        derive_model_dependency(self, self.model)
        return self


def check_trl_args(value: dict[str, Any], target: str, own: typing.Iterable[str]) -> dict[str, Any]:
    """`<section>.trl_args`: options of TRL's config class `target` ("module:Class") that the section's own keys do
    not already set. TRL is imported only when the mapping holds a key (most stages never load it)."""
    if not value:
        return value
    import dataclasses
    import importlib

    module, name = target.split(":")
    options = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), name)) if f.init}
    if unknown := sorted(set(value) - options):
        raise ValueError(f"{unknown[0]}: not an option of {module}.{name}")
    if owned := sorted(set(value) & set(own)):
        raise ValueError(f"{owned[0]}: a key of this section itself; set it there")
    return value


def trl_args_field(target: str) -> Any:
    module, name = target.split(":")
    return Field({}, description=f"any other option of {module}.{name}, by its own name (as its documentation "
                 "spells it); one that a key above or the stage sets is refused")


class TrainConfig(Section):
    """Hyperparameters of one TRL SFTTrainer run (loss on the completion only); shared by `sft` and `teacher.train`."""

    seed: int = Field(0, ge=0, description="RNG seed for data order and dropout")
    learning_rate: float = Field(3e-3, gt=0, lt=1, description="peak learning rate")
    num_train_epochs: float = Field(5.0, gt=0, description="passes over the training set")
    max_steps: int = Field(-1, ge=-1, description="stop after this many optimizer steps (-1: use epochs)")
    per_device_train_batch_size: int = Field(16, ge=1, description="sequences per optimizer step")
    gradient_accumulation_steps: int = Field(1, ge=1, description="micro-batches per optimizer step")
    warmup_steps: float = Field(0.03, ge=0, description="linear warm-up: a share of all steps when < 1, else a "
                                "step count")
    lr_scheduler_type: Scheduler = Field("cosine", description="learning-rate schedule")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    max_length: int = Field(1024, ge=16, description="truncate prompt+completion to this many tokens")
    group_by_length: bool = Field(
        True, description="batch examples of similar length: less padding (step time: bench/sft_step.py)"
    )
    packing: bool = Field(False, description="pack several examples into each max_length sequence (TRL's "
                          "best-fit packing, padding-free): no compute on padding; needs model.attn_implementation "
                          "flash_attention_2")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass: less "
                                         "memory for larger batches, about a third more compute (for GPUs)")
    torch_compile: bool = Field(False, description="train the model compiled by torch.compile (inductor: fused "
                                "kernels, for GPUs; the first steps pay the compile, and each new batch length may "
                                "recompile); bench/gpu.sh measures it")
    max_train_samples: int | None = Field(None, ge=1, description="use only the first N training questions")
    max_eval_samples: int = Field(200, ge=1, description="validation questions for the eval loss")
    eval_steps: int = Field(100, ge=1, description="evaluate validation loss every N steps")
    logging_steps: int = Field(20, ge=1, description="log training loss every N steps")

    trl_args: dict[str, Any] = trl_args_field("trl:SFTConfig")

    @field_validator("trl_args")
    @classmethod
    def _trl_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_trl_args(value, "trl:SFTConfig", cls.model_fields)

    @field_validator("max_steps")
    @classmethod
    def _steps(cls, value: int) -> int:
        if value == 0:
            raise ValueError("max_steps: 0 would train one step (transformers reads it as unset); -1 uses the epochs")
        return value


class SFTConfig(TrainConfig):
    """`sft`: supervised fine-tuning of the student, on gold rationales and/or verified teacher traces."""

    num_train_epochs: float = Field(
        3.0, gt=0, description="passes over the training set (why: studies `longer-sft`, "
        "`quick-default-under-ten-minutes`)"
    )
    source: Literal["gold", "distilled", "mixed"] = Field(
        "gold", description="training completions: gold rationales, verified teacher traces (data/distill), or both "
        "(on the chart task the traces repeat the gold chains: study `a-teacher-that-teaches`)"
    )
    curriculum: bool = Field(
        False, description="after stage 1 (the whole source), a stage 2 on the hard set of data/distill"
    )
    stage2_epochs: float = Field(2.0, gt=0, description="curriculum stage 2: passes over the hard set")
    stage2_learning_rate: float = Field(3e-4, gt=0, lt=1, description="curriculum stage 2: peak learning rate")
    mix: float = Field(
        0.0, ge=0, description="temporal questions of data/animate added to phase 1, as a share of its rows "
        "(0.1: one per ten rows, at most all of them; 0: none)",
    )
    rationale_share: float = Field(
        1.0, gt=0, le=1, description="share of the gold training rows SFT (and sft_extended) trains on, chosen by a "
        "hash of the prompt: below 1, a cold start on few rationales (the rest are left to GRPO, which needs only "
        "answers)")
    rank_drill: RankDrillConfig = Field(default_factory=RankDrillConfig,
                                        description="the ranking drill after the last SFT phase (no steps: none; the "
                                        "chart task only)")


class TeacherConfig(Section):
    """`teacher`: the model that writes reasoning traces for distillation.

    The API key of the `openai` backend is read from the environment variable
    named by `api_key_env`; it never appears in params, logs or outputs.
    """

    seed: int = Field(0, ge=0, description="RNG seed (embedded: weight init and data order)")
    backend: Literal["embedded", "transformers", "openai"] = Field(
        "embedded",
        description="embedded: a larger tiny model trained here on gold rationales; transformers: a causal LM "
        "from `model` (path or Hub id); openai: an OpenAI-compatible endpoint (vLLM, SGLang, a hosted API)",
    )
    model: str | None = Field(None, description="transformers: model path or id; openai: the served model name")
    model_dependency: str = Field(
        NO_MODEL_DEPENDENCY, min_length=1, description="the folder DVC watches for `teacher`: transformers' `model` "
        "when it is a local folder outside models/ and data/ (written by `python -m pipeline params`), else "
        + NO_MODEL_DEPENDENCY)
    base_url: str | None = Field(None, description="openai: endpoint root, e.g. http://127.0.0.1:8000/v1")
    api: Literal["completions", "chat"] = Field("completions", description="openai: which route to call")
    api_key_env: str = Field(
        "OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="openai: NAME of the environment variable holding the API key (never the key itself)",
    )
    concurrency: int = Field(8, ge=1, description="openai: requests in flight at once")
    timeout_s: float = Field(60.0, gt=0, description="openai: seconds before a request times out (then retried)")
    max_retries: int = Field(5, ge=0, description="openai: retries with exponential backoff on 429/5xx/timeouts")
    cache_dir: str = Field(
        "cache/teacher", description="openai: per-prompt response cache (outside DVC outputs, so a rerun resumes)"
    )
    init: Literal["base", "scratch"] = Field(
        "base", description="embedded: the weights it trains from: models/base (the student before SFT, its "
        "table drills included; the size keys below are then unused), or a new model of the size below")
    hidden_size: int = Field(192, ge=16, description="embedded, init scratch: hidden size")
    intermediate_size: int = Field(576, ge=16, description="embedded, init scratch: MLP size")
    num_hidden_layers: int = Field(2, ge=1, description="embedded, init scratch: transformer layers")
    num_attention_heads: int = Field(4, ge=1, description="embedded, init scratch: attention heads")
    num_key_value_heads: int = Field(2, ge=1, description="embedded, init scratch: key/value heads (GQA)")
    train: TrainConfig = Field(
        default_factory=lambda: TrainConfig(num_train_epochs=4.0),
        description="embedded: SFT on the gold rationales (from models/base: longer than the student's, so that it "
        "writes better chains than the student would: study `a-teacher-that-teaches`)"
    )

    @model_validator(mode="after")
    def _backend(self) -> "TeacherConfig":
        if self.backend == "transformers" and not self.model:
            raise ValueError("backend transformers needs `model` (a path or Hub id)")
        if self.backend == "openai" and not (self.base_url and self.model):
            raise ValueError("backend openai needs `base_url` and `model`")
        check_heads(self)
        derive_model_dependency(self, self.model if self.backend == "transformers" else None)
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


RewardName = Literal[
    "accuracy", "format", "step_correctness", "dpa", "rule_shaping", "cosine", "repetition", "overlong", "no_thinking"
]


def _weight(value: object) -> object:
    # pydantic's lax mode would read True as 1.0 and "0.5" as 0.5; a reward weight must be written as a number
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"a reward weight must be a number, got {value!r}")
    return value


RewardWeight = Annotated[float, BeforeValidator(_weight)]
# Custom rewards live in this package at the repository's root, a DVC dependency of `grpo`.
CUSTOM_REWARDS_PACKAGE = "rewards"


def import_reward(spec: str):
    """The function a `module:function` spec names, imported; ValueError saying what is wrong."""
    import importlib

    module_name, _, function_name = spec.partition(":")
    if not function_name or not module_name:
        raise ValueError(f"{spec!r}: write it as module:function (e.g. {CUSTOM_REWARDS_PACKAGE}.example:brevity)")
    if module_name.split(".")[0] != CUSTOM_REWARDS_PACKAGE:
        raise ValueError(f"{spec!r}: the module must be in the repository's {CUSTOM_REWARDS_PACKAGE}/ package (a DVC "
                         "dependency of grpo, so editing it re-runs GRPO)")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"{spec!r}: cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"{spec!r}: {module_name} has no function {function_name}")
    import inspect

    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: TRL's call will tell
        return function
    # TRL calls it by keyword with the prompts, the completions, their token ids and every dataset column
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        raise ValueError(f"{spec!r}: {function_name}{inspect.signature(function)} cannot take TRL's reward arguments, "
                         "passed by keyword; write it as def f(prompts, completions, **columns)")
    return function


class CustomReward(Section):
    """One `rewards.custom` entry: a function with TRL's reward signature and its weight."""

    function: str = Field(..., description="module:function in the rewards/ package; called as TRL calls a reward: "
                          "f(prompts=..., completions=..., answer=..., answer_type=..., **columns) -> one float or "
                          "None per completion")
    weight: RewardWeight = Field(..., description="its weight in the total reward")

    @model_validator(mode="after")
    def _imports(self) -> "CustomReward":
        import_reward(self.function)
        return self


class RewardsConfig(Section):
    """`rewards`: the reward library (pipeline/rl/rewards.py) as GRPO uses it: which rewards, their weights, options.

    The total reward of a completion is the weighted sum; a reward that returns None (its gold cannot be
    parsed) is left out of the sum rather than counted as full credit.
    """

    weights: dict[RewardName, RewardWeight] = Field(
        {"accuracy": 1.0, "format": 0.1, "step_correctness": 0.5}, min_length=1,
        description="reward name -> weight (names: RewardName in pipeline/config.py)",
    )
    custom: dict[str, CustomReward] = Field(
        {}, description="name -> {function: module:function in rewards/, weight}: rewards of your own, added to the "
        "weighted sum (rewards/example.py shows one)")
    cosine_max_len: int = Field(128, ge=1, description="cosine: the length (tokens) where the scale reaches its end")
    cosine_min_correct: float = Field(0.5, description="cosine: reward of a correct completion at max length")
    cosine_max_correct: float = Field(1.0, description="cosine: reward of a correct completion at length 0")
    cosine_min_wrong: float = Field(-1.0, description="cosine: reward of a wrong completion at length 0")
    cosine_max_wrong: float = Field(-0.5, description="cosine: reward of a wrong completion at max length")
    repetition_ngram: int = Field(3, ge=1, description="repetition: word n-gram size")
    repetition_max_penalty: float = Field(-1.0, le=0, description="repetition: reward when every n-gram repeats")
    overlong_max_len: int = Field(160, ge=2, description="overlong: L, the hard length limit in tokens")
    overlong_buffer: int = Field(32, ge=1, description="overlong: c, the soft zone before L where the penalty "
                                 "ramps to -1")
    rule_step_weight: float = Field(
        0.5, ge=0, description="rule_shaping: total weight of the intermediate-step criteria (split evenly over steps)"
    )

    @model_validator(mode="after")
    def _ranges(self) -> "RewardsConfig":
        clash = sorted(set(self.custom) & set(self.weights))
        if clash:
            raise ValueError(f"custom: {clash[0]}: also a built-in reward name; choose another")
        if self.overlong_buffer >= self.overlong_max_len:
            raise ValueError("overlong_buffer must be < overlong_max_len")
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


class GRPOStageConfig(Section):
    """`grpo`: RL on the mined set with TRL's GRPOTrainer (or TBRM), rewards from the `rewards` section."""

    seed: int = Field(0, ge=0, description="RNG seed for data order and sampling")
    init: Literal["sft", "base"] = Field(
        "sft", description="the policy RL starts from (and its KL reference): models/sft, or models/base as loaded "
        "(DeepSeek-R1-Zero's recipe: RL straight from the pretrained or instruct model, no SFT)")
    algorithm: Literal["grpo", "tbrm"] = Field(
        "grpo", description="grpo: group-relative advantages over G rollouts; tbrm: trajectory Bellman residual, "
        "one rollout"
    )
    learning_rate: float = Field(1e-4, gt=0, lt=1, description="peak learning rate")
    lr_scheduler_type: Scheduler = Field("constant_with_warmup", description="learning-rate schedule")
    warmup_steps: float = Field(0.05, ge=0, description="linear warm-up: a share of all steps when < 1, else steps")
    max_steps: int = Field(20, ge=1, description="optimizer steps")
    prompts_per_step: int = Field(8, ge=1, description="prompts per optimizer step (each with G rollouts)")
    num_generations: int = Field(8, ge=2, description="G: rollouts per prompt (grpo); tbrm uses one")
    beta: float = Field(0.04, ge=0, description="KL weight to the SFT reference (grpo), regularization temperature "
                        "(tbrm)")
    epsilon: float = Field(0.2, gt=0, description="PPO-style ratio clip")
    temperature: float = Field(0.8, gt=0, description="rollout sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="rollout nucleus sampling")
    max_completion_length: int = Field(128, ge=8, description="rollout length limit in tokens")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="advantage normalisation")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = Field("dapo", description="TRL loss aggregation")
    guided_replay: bool = Field(
        True, description="a group whose accuracy is at most replay_max_accuracy gets the gold rationale as a sample"
    )
    replay_max_accuracy: float = Field(0.0, ge=0, lt=1, description="guided replay: group accuracy threshold (tau)")
    replay_samples: int = Field(1, ge=1, description="guided replay: rollouts of such a group replaced by the guidance")
    logging_steps: int = Field(5, ge=1, description="log rewards and KL every N steps")
    allow_no_update: bool = Field(False, description="publish models/grpo even when its updates were all zero (no "
                                  "weight moved, or every group's rewards agreed in every step: zero advantages); "
                                  "false: the stage fails, saying which")
    success_prompts: int = Field(
        100, ge=0, description="after training, resample this many RL-pool prompts to measure the success rate p_after"
    )
    use_vllm: bool = Field(False, description="rollouts from TRL's vLLM integration (weights synced every step; "
                           "guided replay and the rewards as with the decode loop); needs vLLM and CUDA")
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate", description="colocate: vLLM in the training process, on its GPU; server: a vLLM server on GPUs "
        "of its own, at vllm_server_base_url or started by the stage")
    vllm_server_base_url: str | None = Field(None, description="server mode: the URL of a running `trl vllm-serve "
                                             "--model models/sft`, e.g. http://127.0.0.1:8000; null: the stage "
                                             "starts one on the last vllm_server_gpus GPUs and stops it at the end")
    vllm_server_gpus: int = Field(1, ge=1, description="server mode, started by the stage: the GPUs it takes "
                                  "(tensor parallel), the last visible ones; training keeps the first")
    vllm_server_timeout: float = Field(600.0, gt=0, description="server mode, started by the stage: seconds to "
                                       "wait for it to answer before the stage fails")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="the GPU memory share vLLM takes "
                                               "(weights and KV cache): of the shared GPU colocated, of each of its "
                                               "own started as a server")

    trl_args: dict[str, Any] = trl_args_field("trl:GRPOConfig")

    @field_validator("trl_args")
    @classmethod
    def _trl_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_trl_args(value, "trl:GRPOConfig", cls.model_fields)

    @model_validator(mode="after")
    def _replay(self) -> "GRPOStageConfig":
        if self.replay_samples >= self.num_generations:
            raise ValueError("replay_samples must be < num_generations (the group needs its own rollouts)")
        return self


class DPOStageConfig(Section):
    """`dpo`: TRL's DPOTrainer from the SFT model on preference pairs (correct vs incorrect trace)."""

    seed: int = Field(0, ge=0, description="RNG seed for data order")
    pairs: Literal["mine", "distill", "both"] = Field(
        "mine", description="mine: on-policy pairs of the SFT policy; distill: teacher pairs; both"
    )
    beta: float = Field(0.1, gt=0, description="DPO temperature: strength of the pull toward the reference")
    loss_type: Literal["sigmoid", "ipo", "hinge", "robust"] = Field("sigmoid", description="DPO loss")
    learning_rate: float = Field(5e-5, gt=0, lt=1, description="peak learning rate")
    num_train_epochs: float = Field(2.0, gt=0, description="passes over the pairs")
    per_device_train_batch_size: int = Field(16, ge=1, description="pairs per optimizer step")
    lr_scheduler_type: Scheduler = Field("cosine", description="learning-rate schedule")
    warmup_steps: float = Field(0.05, ge=0, description="linear warm-up (share of steps when < 1)")
    nll_weight: float = Field(
        0.0, ge=0, description="weight of an NLL loss on the chosen completion (RPO); 0 is plain DPO"
    )
    max_length: int = Field(512, ge=16, description="truncate prompt+completion to this many tokens")
    logging_steps: int = Field(10, ge=1)
    allow_no_update: bool = Field(False, description="publish models/dpo even when its steps left every weight as "
                                  "it was; false: the stage fails, saying so")
    trl_args: dict[str, Any] = trl_args_field("trl:DPOConfig")

    @field_validator("trl_args")
    @classmethod
    def _trl_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_trl_args(value, "trl:DPOConfig", cls.model_fields)


class SFTExtendedConfig(Section):
    """`sft_extended`: the compute-matched baseline. SFT continues from models/sft for GRPO's compute (token passes,
    not seconds: the same on every machine)."""

    learning_rate: float = Field(3e-4, gt=0, lt=1, description="peak learning rate of the continued SFT")
    lr_scheduler_type: Scheduler = Field("cosine", description="learning-rate schedule")
    compute_factor: float = Field(
        1.0, gt=0, description="train for this multiple of GRPO's compute: its rollout tokens times the forward "
        "passes each cost (generation, training, reference), over SFT's three per trained token")


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


class PRMConfig(Section):
    """`prm`: the process reward model, the policy's LM read as a verdict on every token of a line."""

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
    trl_args: dict[str, Any] = trl_args_field("transformers:TrainingArguments")

    @field_validator("trl_args")
    @classmethod
    def _trl_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_trl_args(value, "transformers:TrainingArguments", cls.model_fields)


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


class ModelLoadConfig(Section):
    """`model`: how every stage loads a model (the student, the policies between stages, a Hub teacher, the PRM)."""

    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "float32", description="weights as the sampling stages load them: auto keeps each checkpoint's own dtype "
        "(bfloat16 for most Hub models); float32 samples on any CPU. Training stages keep float32 master weights "
        "(bfloat16 autocast on a GPU) and save float32: a 1e-5 update is below bfloat16's resolution")
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = Field(
        None, description="attention kernel (null: transformers' choice, sdpa where it can; flash_attention_2 needs "
        "the flash-attn package and a GPU)")
    trust_remote_code: bool = Field(
        False, description="run the Python code a Hub model ships (its own modelling or tokenizer classes); off, "
        "only transformers' own classes load. Weights load from safetensors files either way")


class GenerationConfig(Section):
    """`generation`: which engine samples a local model in mine, prm_data, evaluate and a local teacher's distill."""

    engine: Literal["hf", "vllm"] = Field(
        "hf", description="hf: the pipeline's KV-cache decode loop on transformers (any device); vllm: vLLM's "
        "engine (CUDA, `pip install -e .[gpu]`), sampling alike but faster on a GPU; step-level search and the PRM "
        "stay on transformers")
    vllm_gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="vllm: the GPU memory share vLLM takes; the rest holds the transformers "
        "copy that step search and the PRM use")
    vllm_max_model_len: int | None = Field(None, ge=16, description="vllm: longest prompt plus completion in tokens "
                                           "(null: the model's own limit)")


class PromptConfig(Section):
    """`prompt`: how a question reaches the model: as its own text, or through the tokenizer's chat template."""

    format: Literal["raw", "chat"] = Field(
        "raw", description="raw: the question text is the model's input and the completion follows it; chat: a "
        "user message (after `system`, if set) rendered by the tokenizer's own chat template, and SFT, GRPO and "
        "DPO train on TRL's conversational format (a loaded model must have a template; a built one gets one)")
    system: str | None = Field(None, min_length=1, description="chat: a system message before every question "
                               "(null: none)")

    @model_validator(mode="after")
    def _system(self) -> "PromptConfig":
        if self.system is not None and self.format != "chat":
            raise ValueError("system: a system message needs format chat (raw prompts have no roles)")
        return self


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


class LoraConfig(Section):
    """`lora`: low-rank adapters (PEFT's LoRA) instead of full fine-tuning, for the stages switched on here."""

    sft: bool = Field(False, description="sft trains an adapter on models/base (its drills and logit distillation "
                      "train the adapter too)")
    grpo: bool = Field(False, description="grpo trains an adapter on models/sft (its KL reference: the adapter off)")
    dpo: bool = Field(False, description="dpo trains an adapter on models/sft (its reference: the adapter off)")
    r: int = Field(16, ge=1, description="rank of each adapter")
    alpha: float = Field(32.0, gt=0, description="scaling: the update is (alpha / r) * B A")
    dropout: float = Field(0.05, ge=0, lt=1, description="dropout on the adapter's input")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="module names that get an adapter (e.g. [q_proj, v_proj]); all-linear: every "
        "linear layer but the output head")
    save: Literal["merged", "adapter"] = Field(
        "merged", description="merged: the adapter folded into full weights (any loader reads them); adapter: the "
        "adapter's weights alone in models/<stage>, naming its base folder, which every later stage loads beneath it")

    def on(self, stage: str) -> bool:
        return bool(getattr(self, stage))


TrainingStage = Literal[TRAINING_STAGES]  # type: ignore[valid-type]


class LaunchOverride(Section):
    """`launch.stages.<stage>`: that training stage's own process count or accelerate config."""

    num_processes: int | None = Field(None, ge=1, description="processes for this stage (null: launch.num_processes)")
    config_file: str | None = Field(None, min_length=1, description="accelerate config for this stage (null: "
                                    "launch.config_file)")


class LaunchConfig(Section):
    """`launch`: how the training stages (teacher, sft, sft_extended, grpo, dpo, prm) run: one process, or several
    through `accelerate launch` (pipeline/orchestration/launch.py). No stage declares this section among its DVC params,
    so changing it re-runs nothing (`dvc repro -f -s <stage>` does); each process gets per_device_train_batch_size
    rows a step, so N processes train on N times the batch."""

    num_processes: int = Field(1, ge=1, description="processes in all, over every machine (one per GPU; on a CPU, "
                               "at most one per core, with gloo): more than 1 starts the ranks through accelerate")
    config_file: str | None = Field(
        None, min_length=1, description="an accelerate config file (configs/accelerate/: ddp.yaml, fsdp.yaml "
        "(FSDP 2, CUDA only), deepspeed_zero2.yaml, deepspeed_zero3.yaml (GPUs, or CPUs over gloo)); null: DDP (gloo "
        "on CPU)")
    num_machines: int = Field(1, ge=1, description="machines taking part (multi-node: run the stage on each)")
    machine_rank: int = Field(0, ge=0, description="this machine's rank (0: the one that runs DVC and writes the "
                              "outputs)")
    main_process_ip: str | None = Field(None, min_length=1, description="multi-node: the address of machine 0")
    main_process_port: int | None = Field(None, ge=1, le=65535, description="multi-node: a free port on machine 0")
    stages: dict[TrainingStage, LaunchOverride] = Field(
        default_factory=dict, description="per-stage overrides, e.g. {grpo: {num_processes: 4}}")

    @model_validator(mode="after")
    def _machines(self) -> "LaunchConfig":
        if self.machine_rank >= self.num_machines:
            raise ValueError(f"machine_rank: {self.machine_rank} must be below num_machines ({self.num_machines})")
        if self.num_machines > 1 and (self.main_process_ip is None or self.main_process_port is None):
            raise ValueError("main_process_ip and main_process_port: needed when num_machines > 1")
        return self


class ReproConfig(Section):
    """`repro`: how runs execute. No stage declares this section among its DVC params, so changing it re-runs nothing
    (`dvc repro -f -s <stage>` does)."""

    lock_timeout: float = Field(
        0.0, ge=0, description="seconds a second `python -m pipeline repro` waits for the running one before it "
        "exits saying so (0: exits at once)")
    checkpoint_steps: int = Field(
        0, ge=0, description="the TRL trainers (teacher, sft, sft_extended, grpo, dpo, prm) save a checkpoint every "
        "N optimizer steps under .checkpoints/, keyed to the stage's params and inputs (0: none)")
    resume: bool = Field(
        True, description="a stage whose checkpoint matches its params and inputs continues from it (after a "
        "killed run) instead of starting over")


# report_to's names: transformers' integrations (transformers.integrations.INTEGRATION_TO_CALLBACK) but dvclive, which
# every trainer has already, into the stage's DVC output; each with the module it needs installed
TRACKERS = {"tensorboard": ("tensorboard", "tensorboardX"), "trackio": ("trackio",), "mlflow": ("mlflow",),
            "wandb": ("wandb",), "comet_ml": ("comet_ml",), "swanlab": ("swanlab",), "clearml": ("clearml",),
            "neptune": ("neptune",), "azure_ml": ("azureml",), "codecarbon": ("codecarbon",)}
Tracker = Literal[tuple(TRACKERS)]


class TrackingConfig(Section):
    """`tracking`: experiment trackers beside dvclive, for every TRL trainer (teacher, sft, sft_extended, grpo, dpo,
    prm; the table drills log to dvclive only). No stage declares this section among its DVC params: changing it
    re-runs nothing. Accounts, servers and offline modes come from each tracker's own environment variables
    (WANDB_MODE=offline, MLFLOW_TRACKING_URI, TRACKIO_DIR, their API keys), never from here."""

    report_to: list[Tracker] = Field(
        default_factory=list, description="trackers every trainer reports to (transformers' integrations: "
        "tensorboard, trackio, mlflow, wandb, ...; [] : dvclive alone); each needs its package installed")
    project: str = Field("reasoning-pipeline", min_length=1, description="the trackers' project (trackio's project; "
                         "WANDB_PROJECT and MLFLOW_EXPERIMENT_NAME when the environment sets none)")
    logging_dir: str = Field("runs", min_length=1, description="tensorboard: event files go to "
                             "<logging_dir>/<stage>/<commit>-<start time>/, written as the run trains (not tracked)")

    @field_validator("report_to")
    @classmethod
    def _installed(cls, value: list[str]) -> list[str]:
        import importlib.util

        for name in value:
            if not any(importlib.util.find_spec(module) for module in TRACKERS[name]):
                hint = "pip install -e '.[trackers]'" if name == "tensorboard" else f"pip install {TRACKERS[name][0]}"
                raise ValueError(f"{name}: its package is not installed ({hint})")
        if len(set(value)) != len(value):
            raise ValueError("a tracker named twice")
        return value


SECTIONS: dict[str, type[Section]] = {
    "task": TaskConfig,
    "prompt": PromptConfig,
    "model": ModelLoadConfig,
    "generation": GenerationConfig,
    "synthesize": SynthesizeConfig,
    "base": BaseModelConfig,
    "teacher": TeacherConfig,
    "distill": DistillConfig,
    "sft": SFTConfig,
    "rewards": RewardsConfig,
    "mine": MineConfig,
    "grpo": GRPOStageConfig,
    "dpo": DPOStageConfig,
    "sft_extended": SFTExtendedConfig,
    "prm_data": PRMDataConfig,
    "prm": PRMConfig,
    "evaluate": EvaluateConfig,
    "animate": AnimateConfig,
    "lora": LoraConfig,
    "launch": LaunchConfig,
    "repro": ReproConfig,
    "tracking": TrackingConfig,
}

S = TypeVar("S", bound=Section)


def params_path() -> Path:
    """`params.yaml` in the working directory (DVC runs every stage from the repo root)."""
    return Path(os.environ.get("PIPELINE_PARAMS", PARAMS_FILE))


def read_mapping(path: Path, top: str) -> dict:
    """A YAML file whose top level is a mapping (`top` says of what, for the error); {} when empty."""
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of {top}")
    return data


def read_params(path: Path | None = None) -> dict:
    return read_mapping(path or params_path(), "sections")


def _format_errors(path: Path, name: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        error = err.get("ctx", {}).get("error")
        below = error.below if isinstance(error, BooleanForNumber) else ()  # the item's own key or index
        key = ".".join(str(p) for p in (name, *err["loc"], *below))
        if below:
            err = {**err, "input": error.found}  # the boolean, not the list or mapping around it
        if err["type"] == "extra_forbidden":
            lines.append(f"{path}: {key}: unknown key")
        else:
            # a key pasted into api_key_env must not be echoed into logs
            # and a whole section (a check across its keys) is no help echoed back
            got = "" if key.endswith("api_key_env") or isinstance(err.get("input"), dict) else \
                f" (got {err.get('input')!r})"
            lines.append(f"{path}: {key}: {err['msg']}{got}")
    return "\n".join(lines)


def missing_keys(model: type[Section], raw: dict, prefix: str) -> list[str]:
    """Dotted keys of `model` (nested sections too) that `raw` does not spell out."""
    out = []
    for key, field in model.model_fields.items():
        if key not in raw:
            out.append(f"{prefix}{key}")
        elif (isinstance(field.annotation, type) and issubclass(field.annotation, Section)
              and isinstance(raw[key], dict)):
            out += missing_keys(field.annotation, raw[key], f"{prefix}{key}.")
    return out


def parse_section(name: str, model: type[S], raw: object, path: Path | str = PARAMS_FILE, complete: bool = False) -> S:
    """One section checked by its model; with `complete`, every key must be spelled out.

    Stages read params.yaml complete: DVC tracks the values in the file, not this
    module's defaults, so a key left to a default would change silently with them.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {name}: must be a mapping, got {type(raw).__name__}")
    if complete and (missing := missing_keys(model, raw, f"{name}.")):
        raise ConfigError(f"{path}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}: missing (every "
                          "key is spelled out; `python -m pipeline params --write` writes a complete file)")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_errors(Path(path), name, exc)) from None


def load_section(name: str, model: type[S] | None = None, path: Path | None = None) -> S:
    """Parse one section of params.yaml, which must spell out every key."""
    path = path or params_path()
    model = model or SECTIONS[name]  # type: ignore[assignment]
    data = read_params(path)
    return parse_section(name, model, data.get(name), path, complete=True)


def check_vllm_loads_whole_models(generation: GenerationConfig, grpo: GRPOStageConfig, lora: LoraConfig,
                                  path: Path | str = PARAMS_FILE) -> None:
    """vLLM loads a model folder whole, never a LoRA adapter beside its base: `lora.save: adapter` with vLLM asked
    for fails here, before any work, not in the first stage that loads an adapter folder with it."""
    adapters = [stage for stage in ("sft", "grpo", "dpo") if getattr(lora, stage)] if lora.save == "adapter" else []
    problems = []
    if generation.engine == "vllm" and adapters:
        problems.append(f"generation.engine: vllm loads whole models, and lora.save: adapter leaves models/"
                        f"{adapters[0]} an adapter folder: set lora.save: merged or generation.engine: hf")
    if grpo.use_vllm and "sft" in adapters and (grpo.vllm_mode == "colocate" or not grpo.vllm_server_base_url):
        problems.append("grpo.use_vllm: vLLM loads models/sft whole, and lora.save: adapter leaves it an adapter "
                        "folder: set lora.save: merged, or give grpo.vllm_server_base_url of a server that serves "
                        "a merged copy (vllm_mode: server)")
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems))


def check_packing(train: TrainConfig, model: ModelLoadConfig, key: str, path: Path | str = PARAMS_FILE) -> None:
    """Packing needs flash_attention_2: checked by `python -m pipeline repro` and again by the sft and teacher
    stage mains (a plain `dvc repro` skips the former)."""
    if train.packing and model.attn_implementation != "flash_attention_2":
        raise ConfigError(f"{path}: {key}.packing: padding-free packing turns a batch into one sequence, which "
                          "attention other than flash_attention_2 reads whole (quadratic in the batch: 136 GB and "
                          "7x slower on an H200, BENCHMARKS.md); set model.attn_implementation: flash_attention_2 "
                          "or packing: false")


def check_attention(model: ModelLoadConfig, path: Path | str = PARAMS_FILE) -> None:
    """flash_attention_2 needs the flash-attn package and a CUDA device: said at validation, not by the first
    stage that loads a model."""
    if model.attn_implementation != "flash_attention_2":
        return
    import importlib.util

    import torch

    missing = [what for what, ok in (("the flash-attn package (pip install flash-attn)",
                                      importlib.util.find_spec("flash_attn") is not None),
                                     ("a CUDA device", torch.cuda.is_available())) if not ok]
    if missing:
        raise ConfigError(f"{path}: model.attn_implementation: flash_attention_2 needs {' and '.join(missing)}, "
                          "not found here; sdpa or eager run anywhere")


def check_task_fit(task: TaskConfig, prm: "PRMConfig | None" = None, path: Path | str = PARAMS_FILE,
                   rewards: "RewardsConfig | None" = None) -> None:
    """Params of other sections that the task cannot serve, each named (the stage that reads them checks too)."""
    problems = []
    path_given = task.dataset.path if task.dataset is not None else None
    if path_given and is_local_dataset(path_given) and not Path(path_given).expanduser().exists():
        # DVC watches it (task.data_dependency): missing, `dvc repro` would fail on it, after deleting the outputs
        problems.append(f"task.dataset.path: {path_given}: no such file or folder ({LOCAL_RULE}, and a file ending "
                        "in .parquet, .jsonl, .json or .csv is local too)")
    if task.kind != "cof" and prm is not None and "gold" in prm.sources:
        problems.append("prm.sources: gold labels need the chart task's gold step values; a dataset task's steps "
                        "are labelled mc (Monte-Carlo rollouts) and mcts: set prm.sources: [mc, mcts]")
    if task.kind == "cof" and prm is not None and "mc" in prm.sources:
        # prm_data labels the chart task's steps by their gold values, so it writes no mc rows to train on
        problems.append("prm.sources: mc labels are a dataset task's (no gold step values there); the chart task's "
                        "steps are labelled gold and mcts: set prm.sources: [gold, mcts]")
    if task.kind != "cof" and rewards is not None and "step_correctness" in rewards.weights:
        # it would score no completion at all (None on every row), and TRL logs a warning for it every step
        kept = {k: v for k, v in rewards.weights.items() if k != "step_correctness"} or {"accuracy": 1.0}
        problems.append("rewards.weights: step_correctness matches the chart task's gold step values, which a "
                        "dataset task has none of: set rewards.weights: {"
                        + ", ".join(f"{k}: {v}" for k, v in kept.items()) + "}")
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems))


def active_section(name: str) -> Section:
    """One section of params.yaml for code that is not a stage's main (the task, the prompt format, model
    loading): read once per process and params file; its defaults when there is no params file, as in a unit
    test."""
    return _active_section(name, str(params_path()))


@lru_cache(maxsize=None)
def _active_section(name: str, path: str) -> Section:
    model = SECTIONS[name]
    return parse_section(name, model, read_params(Path(path)).get(name), path) if Path(path).exists() else model()
