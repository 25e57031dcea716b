"""The modeling room's params: `base` (the student built or loaded, and its table drills), `model`
(how every model loads), `prompt` (raw or chat) and `lora`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

from pydantic import Field, model_validator

from pipeline.core.params import PIPELINE_OUTPUTS, Section, is_local, watched


class Sized(Protocol):
    """A section that sizes a model built here: `base`, or `teacher` (the training room's, with the same keys)."""

    seed: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int


def check_heads(cfg: Sized) -> None:
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
    stop_at: float = Field(0.95, ge=0, le=1, description="check tables' exact match at which a drill stops (why "
                           "not 0.98: study `quick-default-in-ten-minutes`)")
    learning_rate: float = Field(1e-3, gt=0, lt=1, description="peak AdamW learning rate (5% warm-up, cosine over "
                                 "the most steps, so a drill that stops early stops at a high rate)")
    batch_size: int = Field(16, ge=1, description="drills per optimizer step")
    val_tables: int = Field(200, ge=1, description="held-out random tables the exact-match metrics ask")
    gate: float = Field(0.9, ge=0, le=1, description="numbers drill: held-out exact match an init should reach; "
                        "below it the stage warns and, with `restarts`, drills the next init (seed + 1) (why: study "
                        "`numeric-lookup-clicks`)")
    restarts: int = Field(0, ge=0, description="more inits tried when one misses `gate` (each a full drill run; 0: "
                          "one init, whatever it reads)")


# What `base.model_dependency` and `teacher.model_dependency` hold when no local model folder is loaded: a file both
# stages already list among their code dependencies, so the DVC dependency always resolves.
NO_MODEL_DEPENDENCY = "pipeline/modeling/models.py"


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


def derive_model_dependency(section: Section, loaded: str | None) -> None:
    """`section` (`base` or `teacher`): set its `model_dependency` from the loaded model when the params leave it
    out (code, tests); check it when they spell it out (params.yaml, where `python -m pipeline params` writes it)."""
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
