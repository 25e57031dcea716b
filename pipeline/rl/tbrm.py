"""TBRM, trajectory Bellman residual minimisation (docs/methods.md, "TBRM"), on GRPO's rollouts and rewards.

One rollout per prompt and no advantages: the loss regresses each trajectory's weighted reward on the policy's
soft value of it, against a frozen copy of the starting policy. `grpo.algorithm: tbrm` runs it through the grpo
stage; `grpo.beta` is its temperature b here (GRPO's KL weight there), and guided replay, which replaces rollouts
inside a group, does not apply.
"""

from __future__ import annotations

import copy

import torch
from trl import GRPOConfig, GRPOTrainer

from pipeline.rl.params import GRPOStageConfig


class TBRM:
    """How the grpo stage runs TBRM (the same questions as `pipeline.rl.grpo.GRPO` answers for GRPO)."""

    name = "tbrm"
    grouped = False  # one rollout per prompt: no group whose rewards could all agree

    @staticmethod
    def parsed_generations(cfg: GRPOStageConfig) -> int:
        return 2  # TRL refuses G < 2 when it parses its config; `finish` sets one rollout per prompt

    @staticmethod
    def kl_beta(cfg: GRPOStageConfig) -> float:
        return 0.0  # TRL's KL term off: TBRM keeps its own frozen reference

    @staticmethod
    def rollouts_per_prompt(cfg: GRPOStageConfig) -> int:
        return 1

    @staticmethod
    def replays(cfg: GRPOStageConfig) -> bool:
        return False  # one rollout: no group to replace a rollout in

    @staticmethod
    def reference_passes(cfg: GRPOStageConfig) -> int:
        return 1  # its frozen reference scores every rollout token

    @staticmethod
    def finish(grpo: GRPOConfig, cfg: GRPOStageConfig) -> GRPOConfig:
        """One rollout per prompt, as many rollouts per step as GRPO would take (G x prompts)."""
        grpo.num_generations = 1
        grpo.per_device_train_batch_size = cfg.prompts_per_step * cfg.num_generations
        # over every process of a launched run, as TRL derives it itself
        grpo.generation_batch_size = grpo.per_device_train_batch_size * grpo.steps_per_generation * grpo.world_size
        return grpo

    @staticmethod
    def trainer(cfg: GRPOStageConfig, **kwargs) -> GRPOTrainer:
        return TBRMTrainer(**kwargs, tbrm_beta=cfg.beta)


class TBRMTrainer(GRPOTrainer):
    """Trajectory Bellman Residual Minimisation on GRPOTrainer's rollout and reward machinery.

    Loss per trajectory: (b * logsumexp z(s1) + b * sum_h log(pi(a_h|s_h) / pi_ref(a_h|s_h)) - r)^2, with the
    logits z as soft Q-values (b = `tbrm_beta`), one rollout per prompt, no length normalisation.
    The reference is a frozen copy of the starting policy.
    """

    def __init__(self, *args, tbrm_beta: float, **kwargs) -> None:
        policy = kwargs["model"]
        # Copied before TRL sets up the policy: TRL swaps in a forward bound to the policy instance,
        # and a copy taken afterwards would keep calling the policy (a KL of exactly 0).
        self.tbrm_ref = copy.deepcopy(policy).eval().requires_grad_(False)
        super().__init__(*args, **kwargs)
        self.tbrm_beta = tbrm_beta
        self._tbrm_rewards: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # r(tau): the weighted reward sum (None terms skipped), kept for the loss in place of an advantage
        self._tbrm_rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        return per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        n = output["completion_ids"].size(0)
        start = self.accelerator.process_index * n
        output["advantages"] = self._tbrm_rewards[start : start + n]
        return output

    def _compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        mask = inputs["completion_mask"].float()
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        width = prompt_ids.size(1)  # prompts are left-padded: s1 is the last prompt position for every row

        def logps_and_first(net):
            logits = net(input_ids=input_ids, attention_mask=attention_mask).logits.float()
            steps = logits[:, width - 1 : -1, :]
            logp = torch.log_softmax(steps, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
            return logp, logits[:, width - 1, :]

        logp, z_first = logps_and_first(model)
        with torch.no_grad():
            ref_logp, _ = logps_and_first(self.tbrm_ref.to(input_ids.device))
        log_ratio = ((logp - ref_logp) * mask).sum(dim=1)
        residual = self.tbrm_beta * torch.logsumexp(z_first, dim=-1) + self.tbrm_beta * log_ratio - inputs["advantages"]
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["tbrm/residual"].append(residual.detach().abs().mean().item())
        self._metrics[mode]["kl"].append((log_ratio.detach() / mask.sum(1).clamp(min=1)).mean().item())
        return (residual**2).mean()
