"""The training room's params: one TRL SFT run's hyperparameters (`sft`, `teacher.train`), the
`teacher`, `sft_extended`, the ranking drill, and what every trainer does around its steps: `repro`
(checkpoints, resume) and `tracking` (trackers).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.core.params import Scheduler, Section, TRLSection, trl_args_field
from pipeline.modeling.params import NO_MODEL_DEPENDENCY, check_heads, derive_model_dependency


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


class TrainConfig(TRLSection):
    """Hyperparameters of one TRL SFTTrainer run (loss on the completion only); shared by `sft` and `teacher.train`."""

    TRL_CONFIG = "trl:SFTConfig"

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

    trl_args: dict[str, Any] = trl_args_field(TRL_CONFIG)

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


class SFTExtendedConfig(Section):
    """`sft_extended`: the compute-matched baseline. SFT continues from models/sft for GRPO's compute (token passes,
    not seconds: the same on every machine)."""

    learning_rate: float = Field(3e-4, gt=0, lt=1, description="peak learning rate of the continued SFT")
    lr_scheduler_type: Scheduler = Field("cosine", description="learning-rate schedule")
    compute_factor: float = Field(
        1.0, gt=0, description="train for this multiple of GRPO's compute: its rollout tokens times the forward "
        "passes each cost (generation, training, reference), over SFT's three per trained token")


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


