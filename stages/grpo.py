"""python -m stages.grpo

RL from the SFT model (`grpo.init: base`: from models/base as loaded, R1-Zero's
recipe) on the mined set (data/mine/rl.parquet) with TRL's GRPOTrainer, the
rewards of the `rewards` params section (pipeline/rl/rewards.py) and, with
`grpo.guided_replay`, the gold rationale replayed into groups that failed
entirely (pipeline/rl/grpo.py). `grpo.algorithm: tbrm` trains the trajectory Bellman (pipeline/rl/tbrm.py)
residual instead, one rollout per prompt at the same rollouts per step.

Reward, per-reward and KL curves go through dvclive into plots/grpo/; the
summary, with p0 (the SFT policy's sampled success rate on the RL pool, from
mine), the success-amplification fixed point p*(p0, beta), and the success rate
measured after training on the same pool prompts (p_after beside p_before), into
metrics/grpo.json; the model into models/grpo/.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from pipeline.core import paths
from pipeline.core.io import InputError, atomic_dir, live_atomic_dir, read_rows, write_metrics
from pipeline.core.params import load_section
from pipeline.core.phases import stage_logger
from pipeline.data.params import TaskConfig
from pipeline.evaluation.metrics import sampled_metrics
from pipeline.inference.engines import require_vllm
from pipeline.inference.generation import LocalSampler
from pipeline.modeling import cards, lora
from pipeline.modeling.models import MASTER_DTYPE, load_model
from pipeline.modeling.params import LoraConfig, ModelLoadConfig
from pipeline.orchestration import launch
from pipeline.orchestration.checks import check_task_fit
from pipeline.orchestration.flows import expected_errors, run_stage
from pipeline.rl import vllm_server
from pipeline.rl.grpo import RL_COLUMNS, no_update_reason, rl_train, success_amplification
from pipeline.rl.params import GRPOStageConfig, RewardsConfig
from pipeline.training.trainer import require_update

RL_SET = paths.split_file("rl", stage="mine")
POOL = paths.split_file("pool", stage="mine")


def success_after(cfg: GRPOStageConfig, model, tokenizer, pool: list[dict]) -> dict:
    """The trained policy's sampled success rate on the first `success_prompts` pool prompts, beside the SFT
    policy's on the same prompts (their pass rates from mine): the measured side of the p* comparison."""
    rows = pool[: cfg.success_prompts]
    if not rows:
        return {}
    samples = LocalSampler(model, tokenizer, batch_size=512).sample(
        [r["prompt"] for r in rows], n=cfg.num_generations, temperature=cfg.temperature, top_p=cfg.top_p,
        max_new_tokens=cfg.max_completion_length, seed=cfg.seed,
    )
    after = sampled_metrics(rows, [[g.text for g in gens] for gens in samples], cfg.num_generations)
    return {"success_prompts": len(rows), "p_before": round(sum(r["pass_rate"] for r in rows) / len(rows), 4),
            "p_after": after["sampled_accuracy"]}


def _flow(cfg: GRPOStageConfig, rewards: RewardsConfig, lora_cfg: LoraConfig) -> None:
    rows = read_rows(RL_SET, required=RL_COLUMNS)
    if not rows:
        raise InputError(f"{RL_SET}: no prompts to train on (mine.repeat_* exclude every bucket?)")
    pool = read_rows(POOL, required=("prompt", "answer", "answer_type", "pass_rate"))
    p0 = sum(r["pass_rate"] for r in pool) / max(len(pool), 1)
    model, tokenizer = load_model(paths.model_dir(cfg.init), dtype=MASTER_DTYPE)
    model = lora.wrap(model, lora_cfg, "grpo", cfg.seed)
    with atomic_dir(paths.model_dir("grpo")) as out, live_atomic_dir(paths.live_dir("grpo")) as live:
        metrics = rl_train(cfg, rewards, model, tokenizer, rows, out / ".trainer", live)
        require_update("grpo", no_update_reason(metrics), cfg.allow_no_update)
        # The theory's yardstick: binary-reward GRPO from p0 with KL weight beta converges to p*.
        metrics["p0"] = round(p0, 4)
        metrics["p_star"] = round(success_amplification(p0, cfg.beta), 4) if cfg.beta > 0 else 1.0
        metrics.update(success_after(cfg, model, tokenizer, pool))
        metrics.update(lora.summary(model, lora_cfg))
        stage_logger().info("grpo: %s", metrics)
        shutil.rmtree(out / ".trainer", ignore_errors=True)
        lora.save(model, tokenizer, out, lora_cfg, base=paths.model_dir(cfg.init))
        cards.write_model_manifest(out, "grpo", cfg, inputs=[paths.model_dir(cfg.init), RL_SET],
                                   metrics=metrics, rewards=rewards.model_dump(mode="json"),
                                   **lora.manifest(lora_cfg, "grpo"))
    write_metrics(paths.metrics_file("grpo"), metrics)


def main() -> None:
    with expected_errors():
        cfg = load_section("grpo", GRPOStageConfig)
        rewards = load_section("rewards", RewardsConfig)
        check_task_fit(load_section("task", TaskConfig), rewards=rewards)  # `pipeline repro` checked; plain dvc not
        lora_cfg = load_section("lora", LoraConfig)
        server = contextlib.nullcontext()
        if cfg.use_vllm:
            require_vllm("grpo.use_vllm")  # before the model loads: installed, and a GPU to run it on
            if cfg.vllm_mode == "colocate" and (paths.model_dir(cfg.init) / "adapter_config.json").is_file():
                # TRL's colocated engine loads the policy's folder whole (LLM(model=...)): an adapter has no weights
                raise InputError(f"{paths.model_dir('sft')}: a LoRA adapter folder; vLLM loads whole models: save "
                                 "it merged (lora.save: merged), or use grpo.vllm_mode: server with "
                                 "grpo.vllm_server_base_url of a server that serves a merged copy")
        if vllm_server.starts_server(cfg) and not launch.in_rank():  # a rank uses the stage process's server
            plan = launch.plan_for(os.environ.get("DVC_STAGE", "grpo"))
            server = vllm_server.for_stage(cfg, load_section("model", ModelLoadConfig), paths.model_dir(cfg.init),
                                           plan.num_processes if plan else 1)
    with expected_errors(), server:  # its lines go to the stage's output, before and beside the flow's
        run_stage("grpo", _flow, cfg, rewards, lora_cfg)


if __name__ == "__main__":
    main()
