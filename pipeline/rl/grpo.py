"""Reinforcement learning on verifiable rewards: GRPO with guided replay, TBRM, success amplification.

    metrics = rl_train(cfg, rewards_cfg, model, tokenizer, rows, work_dir, live_dir)

- Rollouts come from `GuidedRollout`, TRL's `rollout_func` hook: the pipeline's
  KV-cache decode loop (finished rows leave the batch) samples the G completions
  of each prompt, or TRL's vLLM engine with `grpo.use_vllm`. With guided replay on, a group whose accuracy is at most
  tau (every rollout wrong, by default) has its last rollouts replaced by the gold
  rationale, so the group carries a positive advantage toward a right chain
  (TaoSR-AGRL's adaptive guided replay; PROPA's SFT on trees that found nothing).
- `grpo.algorithm: tbrm` swaps GRPO's objective for the trajectory Bellman residual with
  one rollout per prompt (`pipeline.rl.tbrm`).
- `success_amplification` is the fixed point p* of Mroueh's recurrence, the
  theory's prediction for binary-reward GRPO from the SFT success rate p0.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from pipeline.core import sharding
from pipeline.core.phases import phase, stage_logger
from pipeline.inference.generation import decode, pad, pad_id
from pipeline.modeling import chat
from pipeline.rl import vllm_server
from pipeline.rl.params import GRPOStageConfig, RewardsConfig
from pipeline.rl.rewards import build_rewards, is_correct
from pipeline.rl.tbrm import TBRM
from pipeline.training import checkpoints, trackers, trl_config
from pipeline.training.trainer import changed, device_kwargs, dvclive_callback, snapshot, unmoved, world

RL_COLUMNS = ("id", "prompt", "answer", "answer_type", "step_values", "rationale")


def success_amplification(p0: float, beta: float, eps: float = 1e-8, iterations: int = 10_000) -> float:
    """Fixed point of p_n = sigmoid(logit p0 + 1 / (beta * sqrt(p_{n-1}(1 - p_{n-1}) + eps))), from p0."""
    if not 0.0 < p0 < 1.0:
        return p0  # nothing to amplify: always or never right
    logit0, p = math.log(p0 / (1 - p0)), p0
    for _ in range(iterations):
        x = logit0 + 1.0 / (beta * math.sqrt(p * (1 - p) + eps))
        nxt = 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0
        if abs(nxt - p) < 1e-12:
            break
        p = nxt
    return p


class GuidedRollout:
    """TRL `rollout_func`: sample each prompt's G completions, then guided replay for all-fail groups.

    `gold` maps a prompt to its row (answer, answer_type, rationale). `stats` counts
    groups, replayed groups and replaced samples over the whole run.
    """

    def __init__(self, gold: dict[str, dict], *, num_generations: int, max_new_tokens: int, temperature: float,
                 top_p: float, seed: int, replay: bool, replay_max_accuracy: float = 0.0,
                 replay_samples: int = 1) -> None:
        self.gold, self.g, self.max_new_tokens = gold, num_generations, max_new_tokens
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.replay, self.tau, self.replay_samples = replay, replay_max_accuracy, replay_samples
        self.stats: Counter = Counter()

    def state_dict(self) -> dict:
        """What a checkpoint keeps (`checkpoints.train`'s `state`): `stats`, counted over the whole run, lives in
        memory only, so a resumed run would otherwise report the resumed steps' counts as the run's. The sampling
        needs nothing: its generator is seeded from the trainer's global step, which the checkpoint restores."""
        return {"stats": dict(self.stats)}

    def load_state_dict(self, saved: dict) -> None:
        self.stats = Counter(saved["stats"])

    def __call__(self, prompts: list, trainer) -> dict:
        tokenizer = trainer.processing_class
        if isinstance(prompts[0], str):
            prompt_ids = tokenizer(text=prompts)["input_ids"]  # as TRL's own generation tokenizes them
        else:  # conversational (prompt.format chat): TRL leaves the template to a rollout_func
            texts = [chat.render_messages(tokenizer, p) for p in prompts]
            prompt_ids = tokenizer(text=texts, add_special_tokens=False)["input_ids"]  # the template has its BOS
        logprobs = None  # the decode loop's: none, so TRL computes the old policy's itself
        if getattr(trainer, "use_vllm", False):
            completion_ids, logprobs = self.sample_vllm(trainer, prompt_ids)
        else:
            with sharding.generating(trainer) as model:  # ZeRO-3: gathered whole while it samples
                completion_ids = self.sample(model, tokenizer, prompt_ids, trainer.state.global_step,
                                             trainer.accelerator.process_index)
        if self.replay:
            completion_ids, replaced = self.guide(prompts, completion_ids, tokenizer, trainer)
            if logprobs is not None:  # a replayed rollout was not sampled: no logprob, so TRL corrects nothing there
                logprobs = [[None] * len(ids) if i in replaced else lps
                            for i, (ids, lps) in enumerate(zip(completion_ids, logprobs))]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    def sample(self, model, tokenizer, prompt_ids: list[list[int]], step: int, rank: int = 0) -> list[list[int]]:
        ids, mask = pad(prompt_ids, pad_id(tokenizer), left=True)
        # new draws every step and on every rank of a launched run, reproducible
        rng = torch.Generator().manual_seed(self.seed * 1_000_003 + step + 7_919 * rank)
        return decode(model, ids.to(model.device), mask.to(model.device), self.max_new_tokens,
                      tokenizer.eos_token_id, (self.temperature, self.top_p, rng, 0))

    @staticmethod
    def sample_vllm(trainer, prompt_ids: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        """(rollouts, each token's sampling logprob) from TRL's vLLM engine (`grpo.use_vllm`), asked as TRL's own
        generation asks.

        With a `rollout_func`, TRL only pushes the policy's weights to vLLM before each step; generating is the
        function's job. `prompt_ids` holds each prompt G times in a row: colocated vLLM samples each entry once,
        a server takes every G-th and samples G of it. The sampling settings are TRL's (`grpo_args`). The
        logprobs feed TRL's importance-sampling correction for the gap between vLLM's and the trainer's numbers.
        """
        _, completion_ids, logprobs, _ = trainer.vllm_generation.generate(
            prompts=prompt_ids, images=None, num_generations=trainer.num_generations)
        # vLLM gives the top logprobs of each position, the sampled token's first (as TRL's own generation reads them)
        return [list(ids) for ids in completion_ids], [[lp[0] for lp in seq] for seq in logprobs]

    def guide(self, prompts: list, completion_ids: list[list[int]], tokenizer, trainer=None
              ) -> tuple[list[list[int]], set[int]]:
        """(the rollouts with the last `replay_samples` of each failing group replaced by the gold rationale,
        the indices of those replaced)."""
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        out = list(completion_ids)
        replayed, replaced = 0, set()
        for start in range(0, len(prompts), self.g):
            if any(p != prompts[start] for p in prompts[start : start + self.g]):
                # TRL keeps a prompt's G rollouts together on one rank when the per-process batch is a
                # multiple of G (grpo_args makes it so); a split group could not be judged here
                raise RuntimeError(f"guided replay: rollouts {start}..{start + self.g - 1} are not one prompt's group")
            row = self.gold[chat.question(prompts[start])]
            group = texts[start : start + self.g]
            accuracy = sum(is_correct(t, row["answer"], row["answer_type"]) for t in group) / len(group)
            self.stats["groups"] += 1
            if accuracy > self.tau + 1e-9:
                continue
            guided = tokenizer(row["rationale"], add_special_tokens=False)["input_ids"]
            if len(guided) > self.max_new_tokens - 1:  # cut like a rollout: its answer, at the end, is lost
                self.stats["replayed_cut"] += 1
                guided = guided[: self.max_new_tokens - 1]
            for i in range(start + self.g - self.replay_samples, start + self.g):
                out[i] = guided + [tokenizer.eos_token_id]
                replaced.add(i)
            replayed += 1
        self.stats["replayed_groups"] += replayed
        self.stats["replayed_samples"] += replayed * self.replay_samples
        if trainer is not None and hasattr(trainer, "_log_metric"):
            trainer._log_metric("guided_replay/group_share", replayed / max(len(prompts) // self.g, 1))
        return out, replaced


class GRPO:
    """How the grpo stage runs GRPO: G rollouts per prompt, group-relative advantages, TRL's own loss and KL term.
    `pipeline.rl.tbrm.TBRM` answers the same questions for TBRM; `grpo.algorithm` picks one (`ALGORITHMS`)."""

    name = "grpo"
    grouped = True  # rollouts come in groups: a group whose rewards all agree has zero advantages

    @staticmethod
    def parsed_generations(cfg: GRPOStageConfig) -> int:
        return cfg.num_generations

    @staticmethod
    def kl_beta(cfg: GRPOStageConfig) -> float:
        return cfg.beta

    @staticmethod
    def rollouts_per_prompt(cfg: GRPOStageConfig) -> int:
        return cfg.num_generations

    @staticmethod
    def replays(cfg: GRPOStageConfig) -> bool:
        return cfg.guided_replay

    @staticmethod
    def reference_passes(cfg: GRPOStageConfig) -> int:
        return 1 if cfg.beta > 0 else 0  # the reference model scores every rollout token for the KL term

    @staticmethod
    def finish(grpo: GRPOConfig, cfg: GRPOStageConfig) -> GRPOConfig:
        return grpo

    @staticmethod
    def trainer(cfg: GRPOStageConfig, **kwargs) -> GRPOTrainer:
        return GRPOTrainer(**kwargs)


ALGORITHMS = {"grpo": GRPO, "tbrm": TBRM}  # grpo.algorithm

# TRL's vLLM options, which the schema names as TRL does: passed only with grpo.use_vllm (the server's URL may come
# from the server the stage started)
VLLM_ARGS = ("use_vllm", "vllm_mode", "vllm_server_base_url", "vllm_gpu_memory_utilization", "vllm_server_timeout")


def rl_dataset(rows: Sequence[dict]) -> Dataset:
    """The RL pool as TRL reads it: a prompt in the active format (`pipeline.modeling.chat`) and the reward columns."""
    return Dataset.from_dict({c: [chat.prompt(r[c]) if c == "prompt" else r[c] for r in rows] for c in RL_COLUMNS})


def grpo_args(cfg: GRPOStageConfig, rewards_weights: list[float], output_dir: Path, **overrides) -> GRPOConfig:
    """TRL GRPOConfig from the params section (also used by bench/grpo_step.py for the raw-TRL baseline)."""
    algorithm = ALGORITHMS[cfg.algorithm]
    generations = algorithm.parsed_generations(cfg)
    args = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=cfg.prompts_per_step * generations,
        num_generations=generations,
        beta=algorithm.kl_beta(cfg),
        reward_weights=rewards_weights,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
        **device_kwargs(),
    )
    if cfg.use_vllm:  # TRL's vLLM engine generates; `GuidedRollout` calls it and replays as on the decode loop
        # a server the stage started (pipeline.rl.vllm_server) when the params name none
        url = cfg.vllm_server_base_url or os.environ.get(vllm_server.URL_ENV)
        args.update(use_vllm=True, vllm_mode=cfg.vllm_mode, vllm_server_base_url=url,
                    vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization)
    return algorithm.finish(trl_config.build(GRPOConfig, cfg, args, overrides, exclude=VLLM_ARGS), cfg)


def passes_per_token(cfg: GRPOStageConfig) -> int:
    """Forward-pass equivalents GRPO spends on each rollout token: one to generate it, three to train on it
    (forward and backward), one more for the frozen reference when the KL term is on (beta > 0; TBRM keeps
    its own reference). The usual 2N / 6N FLOP model of a decoder of N parameters, in units of 2N."""
    return 1 + 3 + ALGORITHMS[cfg.algorithm].reference_passes(cfg)


@phase("train")
def rl_train(cfg: GRPOStageConfig, rewards_cfg: RewardsConfig, model, tokenizer, rows: Sequence[dict],
             work_dir: Path, live_dir: Path) -> dict:
    """GRPO (or TBRM) in place on `model` over the mined rows; returns summary metrics."""
    funcs, weights = build_rewards(rewards_cfg)
    algorithm = ALGORITHMS[cfg.algorithm]
    rollout = GuidedRollout(
        {r["prompt"]: r for r in rows}, num_generations=algorithm.rollouts_per_prompt(cfg),
        max_new_tokens=cfg.max_completion_length, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
        replay=algorithm.replays(cfg), replay_max_accuracy=cfg.replay_max_accuracy,
        replay_samples=cfg.replay_samples,
    )
    args = grpo_args(cfg, weights, work_dir, **trackers.arguments(live_dir))
    kwargs = dict(model=model, reward_funcs=funcs, args=args, train_dataset=rl_dataset(rows),
                  processing_class=tokenizer, rollout_func=rollout, callbacks=[dvclive_callback(live_dir)])
    trainer = algorithm.trainer(cfg, **kwargs)
    before = snapshot(model)
    start = time.perf_counter()
    result = checkpoints.train(trainer, cfg, state={"guided_replay": rollout})
    seconds = time.perf_counter() - start
    sharding.unshard(trainer, model)  # ZeRO-3: whole weights again, to save
    logs = [log for log in trainer.state.log_history if "reward" in log]
    first, last = (logs[0], logs[-1]) if logs else ({}, {})
    metrics = {
        "algorithm": cfg.algorithm,
        "steps": result.global_step,
        "prompts": len(rows),
        "rollouts": result.global_step * trainer.args.per_device_train_batch_size * trainer.accelerator.num_processes,
        "train_seconds": round(seconds, 1),
        "seconds_per_step": round(seconds / max(result.global_step, 1), 3),
        # prompt and completion tokens of every rollout (TRL's count), and what they cost in token passes
        # (2 x parameters FLOPs each): sft_extended trains for the same compute
        "tokens": int(trainer.state.num_input_tokens_seen),
        "token_passes": int(trainer.state.num_input_tokens_seen) * passes_per_token(cfg),
        "reward_first": round(first.get("reward", float("nan")), 4),
        "reward_last": round(last.get("reward", float("nan")), 4),
        "accuracy_reward_first": round(first.get("rewards/accuracy/mean", float("nan")), 4),
        "accuracy_reward_last": round(last.get("rewards/accuracy/mean", float("nan")), 4),
        "kl_last": round(last.get("kl", 0.0), 5),
        **health(logs),
        **changed(before, model),
        **world(trainer),
    }
    if rollout.replay:
        metrics["guided_replay"] = summed_over_ranks(trainer, rollout.stats)
        if rollout.stats["replayed_cut"] and trainer.accelerator.is_main_process:
            stage_logger().warning(
                "grpo: %d gold rationale(s) replayed into failing groups were longer than grpo.max_completion_length "
                "(%d tokens) and were cut there, losing the answer they end with, so they scored as wrong; raise it",
                rollout.stats["replayed_cut"], cfg.max_completion_length)
    return metrics


# TRL's per-step GRPO metrics (averaged over each logging interval) -> the summary's names
HEALTH = {"frac_reward_zero_std": "zero_std_share", "clip_ratio/region_mean": "clip_ratio",
          "completions/mean_length": "completion_length", "completions/clipped_ratio": "truncated_share"}


def health(logs: Sequence[dict]) -> dict[str, float]:
    """GRPO's health over the run, the mean of its logs: `zero_std_share`, the share of groups whose rewards all
    agreed (their advantages are zero: nothing to learn from); `clip_ratio`, the share of tokens whose probability
    ratio the PPO clip cut; `completion_length` in tokens, and `truncated_share`, the rollouts that hit
    max_completion_length."""
    out = {}
    for key, name in HEALTH.items():
        values = [log[key] for log in logs if key in log]
        if values:
            out[name] = round(sum(values) / len(values), 4)
    return out


def no_update_reason(metrics: dict) -> str | None:
    """Why a GRPO run (`rl_train`'s metrics) learned nothing (None: it did): no weight moved, or every group of
    every logged step had rewards that all agreed (a mean share of 1: every log's was), so every advantage, and the
    policy gradient, was zero; weight decay alone may still have moved the weights. TBRM's single rollouts have no
    groups: only its weights are read."""
    if ALGORITHMS[metrics["algorithm"]].grouped and metrics["steps"] and metrics.get("zero_std_share", 0.0) >= 1.0:
        return (f"in all {metrics['steps']} step(s) every group's rewards agreed (frac_reward_zero_std 1.0): every "
                "advantage was zero, so the policy did not learn (rewards that cannot tell rollouts apart, a policy "
                "that gets all or none of a prompt's rollouts right; guided replay, grpo.guided_replay, helps the "
                "latter)")
    return unmoved(metrics)


def summed_over_ranks(trainer, counts: Counter) -> dict[str, int]:
    """`counts` (each rank's own: its share of the groups) added up over the ranks of a launched run."""
    keys = ("groups", "replayed_groups", "replayed_samples")
    if trainer.accelerator.num_processes == 1:
        return {k: counts[k] for k in keys}
    total = trainer.accelerator.reduce(torch.tensor([counts[k] for k in keys], device=trainer.accelerator.device),
                                       reduction="sum")
    return dict(zip(keys, (int(v) for v in total.tolist())))
