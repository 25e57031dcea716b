"""The RL room's params: `rewards`, `grpo` (GRPO or TBRM) and `dpo`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from pipeline.core.params import Scheduler, Section, TRLSection, trl_args_field

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
        description="reward name -> weight (names: RewardName in pipeline/rl/params.py)",
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


class GRPOStageConfig(TRLSection):
    """`grpo`: RL on the mined set with TRL's GRPOTrainer (or TBRM), rewards from the `rewards` section."""

    TRL_CONFIG = "trl:GRPOConfig"

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

    trl_args: dict[str, Any] = trl_args_field(TRL_CONFIG)

    @model_validator(mode="after")
    def _replay(self) -> "GRPOStageConfig":
        if self.replay_samples >= self.num_generations:
            raise ValueError("replay_samples must be < num_generations (the group needs its own rollouts)")
        return self


class DPOStageConfig(TRLSection):
    """`dpo`: TRL's DPOTrainer from the SFT model on preference pairs (correct vs incorrect trace)."""

    TRL_CONFIG = "trl:DPOConfig"

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
    trl_args: dict[str, Any] = trl_args_field(TRL_CONFIG)
