"""Shared pieces of the TRL training stages: the SFT run itself, datasets, dvclive logging, weight checks, step
timing."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from datasets import Dataset
from transformers import Trainer, TrainerCallback
from trl import SFTConfig as TRLSFTConfig
from trl import SFTTrainer

from pipeline.core import sharding
from pipeline.core.io import StageFailed, untimed
from pipeline.core.phases import phase, stage_logger
from pipeline.modeling import chat
from pipeline.training import checkpoints, trackers, trl_config
from pipeline.training.params import TrainConfig


def prompt_completion_dataset(rows: Sequence[dict], completion_key: str = "rationale") -> Dataset:
    """TRL's prompt-completion format (conversational with prompt.format chat): the loss falls on the completion
    only."""
    return Dataset.from_dict(
        {"prompt": [chat.prompt(r["prompt"]) for r in rows],
         "completion": [chat.completion(r[completion_key]) for r in rows]}
    )


PLACE_ARGS = checkpoints.PLACE_ARGS  # not how a run trains: left out of the arguments dvclive records


def dvclive_callback(live_dir: Path):
    """transformers' DVCLiveCallback writing curves into `live_dir` (no dvc.yaml edits, no DVC experiment), without
    the wall-clock figures (`train_runtime`, `*_per_second`, TRL's `step_time`) or the run's folders: the curves are
    a DVC output, and a re-run that trains the same steps writes the same bytes."""
    from dvclive import Live
    from transformers.integrations import DVCLiveCallback

    class UntimedDVCLiveCallback(DVCLiveCallback):
        def setup(self, args, state, model):
            self._initialized = True
            if state.is_world_process_zero:
                self.live.log_params({k: v for k, v in args.to_dict().items() if k not in PLACE_ARGS})

        def on_log(self, args, state, control, model=None, logs=None, **kwargs):
            super().on_log(args, state, control, model=model, logs=untimed(logs or {}), **kwargs)

    return UntimedDVCLiveCallback(live=Live(dir=str(live_dir), dvcyaml=None, save_dvc_exp=False))


def snapshot(model) -> dict[str, torch.Tensor]:
    """A copy of the weights in CPU memory (on a GPU a second copy there could cost as much as the model).

    A model that an earlier phase left sharded by FSDP (sft's curriculum, its logit distillation) is gathered,
    by every rank: global rank 0 gets the copy, the others {} (as `weights_changed` reads them).
    """
    if sharding.sharded(model):
        return sharding.full_state_dict(model)  # in CPU memory already, a copy
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def weights_changed(before: dict[str, torch.Tensor], model) -> float:
    """Share of parameter tensors that differ from `before` (0.0: training did nothing); see `changed`."""
    return changed(before, model)["weights_changed"]


def changed(before: dict[str, torch.Tensor], model) -> dict[str, float]:
    """How much of the model training moved: `weights_changed`, the share of parameter tensors that differ from
    `before`, and `elements_changed`, the share of their elements (a tensor counts as changed when one element
    did; updates that round away in a low precision leave most elements as they were).

    `before` is a CPU snapshot (`snapshot`); the model may be on the GPU (where a trainer moved it, or where it
    was loaded), so each of its tensors comes to the CPU to be compared. Sharded by FSDP, the weights are gathered
    (every rank calls this) and only global rank 0, which writes the metrics, gets them and the shares; the
    others get 0.0.
    """
    after = sharding.full_state_dict(model) if sharding.sharded(model) else model.state_dict()
    if not after:
        return {"weights_changed": 0.0, "elements_changed": 0.0}
    tensors = elements = total = 0
    for k, old in before.items():
        moved = int((old != after[k].cpu()).sum())
        tensors += moved > 0
        elements += moved
        total += old.numel()
    return {"weights_changed": round(tensors / max(len(before), 1), 3),
            "elements_changed": round(elements / max(total, 1), 3)}


class NoUpdate(StageFailed):
    """Training ran its steps but moved nothing worth publishing; the message says why."""


def require_update(stage: str, reason: str | None, allowed: bool) -> None:
    """A run whose updates were all zero fails its stage (exit 1, its outputs never put in place) rather than
    publish its starting model as trained; `allowed` (`<stage>.allow_no_update`) only warns."""
    if reason is None:
        return
    if not allowed:
        raise NoUpdate(f"{stage}: {reason}; nothing is published (set {stage}.allow_no_update: true to publish the "
                       "model anyway)")
    stage_logger().warning("%s: %s; published anyway (%s.allow_no_update)", stage, reason, stage)


def unmoved(metrics: dict) -> str | None:
    """Why a run's updates were zero, read from its weights: steps taken, no tensor changed (None: some did)."""
    if metrics["steps"] and not metrics["weights_changed"]:
        return (f"{metrics['steps']} step(s) left the weights as they were (a learning rate of 0, as in the first "
                "warm-up step, or gradients that were all zero)")
    return None


def world(trainer) -> dict:
    """`world_size`: the processes that trained it (launch.num_processes); with more than one, `distributed`: how
    they shared the work, as accelerate ran it ("MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED zero-3")."""
    acc = trainer.accelerator
    if acc.num_processes == 1:
        return {"world_size": 1}
    kind = acc.distributed_type.value
    if kind == "DEEPSPEED":
        kind += f" zero-{acc.state.deepspeed_plugin.zero_stage}"
    return {"world_size": acc.num_processes, "distributed": kind}


class StepTimer(TrainerCallback):
    """Wall seconds of every optimizer step (bench/sft_step.py, bench/grpo_step.py)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)


def device_kwargs() -> dict:
    """Trainer precision/device settings for this machine.

    TRL defaults to bf16 and gradient checkpointing; on a CPU both make a tiny
    model many times slower (bf16 autocast has no fast CPU kernels here, and
    re-computing activations buys nothing when they are a few MB).

    A rank of a DeepSpeed launch without CUDA (accelerate sets ACCELERATE_USE_DEEPSPEED) must not ask for the CPU:
    accelerate would then drop DeepSpeed for plain DDP. It names gloo instead, which DeepSpeed's CPU accelerator
    runs its collectives on.
    """
    cuda = torch.cuda.is_available()
    deepspeed_on_cpu = not cuda and os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    return {
        "use_cpu": not cuda and not deepspeed_on_cpu,
        **({"ddp_backend": "gloo"} if deepspeed_on_cpu else {}),
        "bf16": cuda and torch.cuda.is_bf16_supported(),
        "gradient_checkpointing": False,
    }


def trainer_args(cfg: TrainConfig, output_dir: Path, **overrides) -> TRLSFTConfig:
    """TRL SFTConfig from a params section (`pipeline.training.trl_config`: the fields it shares with TRL's, then
    these, then `trl_args`); `overrides` for a curriculum phase (e.g. its learning rate)."""
    stage_args = dict(
        output_dir=str(output_dir),
        per_device_eval_batch_size=cfg.per_device_train_batch_size,
        train_sampling_strategy="group_by_length" if cfg.group_by_length else "random",
        completion_only_loss=True,
        eval_strategy="steps",
        save_strategy="no",  # DVC keeps the one model that matters; no checkpoints
        report_to="none",  # dvclive is attached explicitly, with its folder
        dataloader_num_workers=0,
        **device_kwargs(),
    )
    return trl_config.build(TRLSFTConfig, cfg, stage_args, overrides)


class PlainHeadSFTTrainer(SFTTrainer):
    """TRL's SFTTrainer with its loss through the model's plain LM head, for machines without CUDA.

    Why: TRL projects through its fused LM head in tiles (it spares GPU memory on large vocabularies) and computes
    entropy and token accuracy on every step; on a CPU that is about a third of a small model's step
    (BENCHMARKS.md, "SFT step time"). The loss is the same: the model's own next-token cross-entropy on the labels
    TRL's collator built (the completion's tokens), summed over the batch's tokens. TRL's `num_tokens` is kept.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs["use_cache"] = False  # no KV cache in a training forward
        out = Trainer.compute_loss(self, model, inputs, return_outputs=return_outputs,
                                   num_items_in_batch=num_items_in_batch)
        if model.training:  # TRL's running count of trained tokens (no packing without CUDA: every batch has a mask)
            self._total_train_tokens += self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
        return out


def sft_trainer_class() -> type[SFTTrainer]:
    """The SFT trainer for this machine: TRL's own with CUDA, else `PlainHeadSFTTrainer`."""
    return SFTTrainer if torch.cuda.is_available() else PlainHeadSFTTrainer


def truncated(prepared, rows: int, args) -> dict:
    """How TRL's truncation to `max_length` met the training rows, read from the dataset it prepared.

    TRL cuts every tokenized row to `max_length` tokens and then drops the rows left without a completion
    token to learn (their prompt alone filled it), both silently. A prepared row exactly `max_length` long
    was cut there or was exactly that long: both are counted, so the count is an upper bound. With packing
    (rows joined into `max_length` sequences) the rows cannot be told apart again: nothing is counted.
    """
    if args.packing or args.max_length is None:
        return {"rows_at_max_length": None, "rows_dropped": None}
    return {"rows_at_max_length": sum(len(ids) >= args.max_length for ids in prepared["input_ids"]),
            "rows_dropped": rows - len(prepared)}


@phase("train")
def sft_train(
    cfg: TrainConfig, model, tokenizer, train_rows: Sequence[dict], val_rows: Sequence[dict], work_dir: Path,
    live_dir: Path, **overrides,
) -> dict:
    """One TRL SFTTrainer run in place on (prompt, rationale) rows; returns its summary metrics."""
    train = prompt_completion_dataset(train_rows[: cfg.max_train_samples])
    val = prompt_completion_dataset(val_rows[: cfg.max_eval_samples])
    before = snapshot(model)
    trainer = sft_trainer_class()(
        model=model,
        args=trainer_args(cfg, work_dir, **{**trackers.arguments(live_dir), **overrides}),
        train_dataset=train,
        eval_dataset=val,
        processing_class=tokenizer,
        callbacks=[dvclive_callback(live_dir)],
    )
    cut = truncated(trainer.train_dataset, len(train), trainer.args)
    if (cut["rows_at_max_length"] or cut["rows_dropped"]) and trainer.accelerator.is_main_process:
        stage_logger().warning(
            "SFT: %d of %d training rows reach max_length %d tokens, so their completions may be cut short there, "
            "and %d were dropped, their prompt alone filling it; raise max_length in this stage's params to keep them",
            cut["rows_at_max_length"], len(train), trainer.args.max_length, cut["rows_dropped"])
    start = time.perf_counter()
    result = checkpoints.train(trainer, cfg)
    seconds = time.perf_counter() - start
    final_eval = trainer.evaluate()
    sharding.unshard(trainer, model)  # ZeRO-3: whole weights again for what follows (a drill, a later phase)
    # TRL logs the running count of trained (non-padding) tokens as `num_tokens`.
    tokens = max((log.get("num_tokens", 0) for log in trainer.state.log_history), default=0)
    return {
        "train_loss": round(result.training_loss, 4),
        "eval_loss": round(final_eval["eval_loss"], 4),
        "steps": result.global_step,
        "examples": len(train),
        **cut,
        "train_seconds": round(seconds, 1),
        "tokens_per_second": round(tokens / seconds, 1),
        **changed(before, model),
        **world(trainer),
    }


@phase("train (logit distillation)")
def logit_distill(
    cfg, model, teacher, tokenizer, rows: Sequence[dict], work_dir: Path, live_dir: Path, *, seed: int,
    batch_size: int,
) -> dict:
    """On-policy logit distillation (TRL's DistillationTrainer): the student samples, the teacher scores.

    Needs a shared tokenizer; `cfg` is the `distill` params section (logit_* fields).
    """
    from trl import DistillationConfig, DistillationTrainer

    args = DistillationConfig(
        output_dir=str(work_dir),
        seed=seed,
        learning_rate=cfg.logit_learning_rate,
        max_steps=cfg.logit_steps,
        per_device_train_batch_size=batch_size,
        max_completion_length=cfg.logit_max_new_tokens,
        temperature=cfg.logit_temperature,
        beta=cfg.logit_beta,
        logging_steps=max(1, cfg.logit_steps // 20),
        save_strategy="no",
        **trackers.arguments(live_dir),
        dataloader_num_workers=0,
        **device_kwargs(),
    )
    dataset = Dataset.from_dict({"prompt": [chat.prompt(r["prompt"]) for r in rows]})
    before = snapshot(model)
    trainer = DistillationTrainer(
        model=model, teacher_model=teacher, args=args, train_dataset=dataset, processing_class=tokenizer,
        callbacks=[dvclive_callback(live_dir)],
    )
    start = time.perf_counter()
    result = checkpoints.train(trainer, cfg)
    seconds = time.perf_counter() - start
    sharding.unshard(trainer, model)
    return {
        "train_loss": round(result.training_loss, 4),
        "steps": result.global_step,
        "train_seconds": round(seconds, 1),
        **changed(before, model),
        **world(trainer),
    }


@phase("train")
def dpo_args(cfg, work_dir: Path, **overrides):
    """TRL DPOConfig from the `dpo` section: `nll_weight` > 0 adds TRL's "sft" loss to `loss_type`, weighted."""
    from trl import DPOConfig

    losses, weights = [cfg.loss_type], [1.0]
    if cfg.nll_weight > 0:
        losses, weights = [cfg.loss_type, "sft"], [1.0, cfg.nll_weight]
    stage_args = dict(output_dir=str(work_dir), loss_type=losses, loss_weights=weights, save_strategy="no",
                      dataloader_num_workers=0, **device_kwargs())
    return trl_config.build(DPOConfig, cfg, stage_args, overrides)


def dpo_train(cfg, model, tokenizer, pairs: Sequence[dict], work_dir: Path, live_dir: Path) -> dict:
    """TRL DPOTrainer in place on `model` over (prompt, chosen, rejected) pairs; `cfg` is the `dpo` section.

    The reference is TRL's frozen copy of the starting model. `nll_weight` > 0 adds TRL's "sft" loss on the
    chosen completion (RPO), which keeps a small model from lowering both likelihoods at once.
    """
    from trl import DPOTrainer

    args = dpo_args(cfg, work_dir, **trackers.arguments(live_dir))
    dataset = Dataset.from_dict({"prompt": [chat.prompt(p["prompt"]) for p in pairs],
                                 **{k: [chat.completion(p[k]) for p in pairs] for k in ("chosen", "rejected")}})
    before = snapshot(model)
    trainer = DPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=[dvclive_callback(live_dir)])
    start = time.perf_counter()
    result = checkpoints.train(trainer, cfg)
    seconds = time.perf_counter() - start
    sharding.unshard(trainer, model)
    logs = [log for log in trainer.state.log_history if "rewards/accuracies" in log]
    return {
        "pairs": len(pairs),
        "train_loss": round(result.training_loss, 4),
        "steps": result.global_step,
        "train_seconds": round(seconds, 1),
        "reward_accuracy_last": round(logs[-1]["rewards/accuracies"], 4) if logs else None,
        "reward_margin_last": round(logs[-1]["rewards/margins"], 4) if logs else None,
        **changed(before, model),
        **world(trainer),
    }


class QuestionGroupedSampler(torch.utils.data.Sampler):
    """Each question's paths one after another, the questions in a new random order every epoch: a batch then
    holds whole questions (but at its two edges), so the PRM's pair loss finds their (right, wrong) pairs."""

    def __init__(self, questions: Sequence[int], seed: int) -> None:
        groups: dict[int, list[int]] = {}
        for i, q in enumerate(questions):
            groups.setdefault(q, []).append(i)
        self.groups = list(groups.values())
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The Trainer names each epoch before iterating it, a resumed run included, so the order of epoch e is
        the same whether or not the run was interrupted before it."""
        self.epoch = epoch

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        for g in torch.randperm(len(self.groups), generator=generator).tolist():
            yield from self.groups[g]


class PRMTrainer(Trainer):
    """transformers' Trainer with the PRM loss on the scored lines' token spans (pipeline.prm.model.prm_loss)."""

    def __init__(self, *args, chain_weight: float = 0.0, pair_weight: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.chain_weight, self.pair_weight = chain_weight, pair_weight

    def _get_train_sampler(self, train_dataset=None):
        if self.pair_weight:  # pairs need a question's paths in one batch; a random order scatters them
            return QuestionGroupedSampler(self.train_dataset["question"], self.args.seed)
        return super()._get_train_sampler(train_dataset)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from pipeline.prm.model import prm_loss

        starts, ends, labels, kinds = (inputs.pop(k) for k in ("score_starts", "score_ends", "score_labels",
                                                               "score_kinds"))
        questions, outcomes = inputs.pop("score_questions", None), inputs.pop("score_outcomes", None)
        outputs = model(**inputs)
        loss = prm_loss(outputs.logits, inputs["input_ids"], starts, ends, labels, kinds, self.chain_weight,
                        questions, outcomes, self.pair_weight)
        return (loss, outputs) if return_outputs else loss


@phase("train")
def prm_args(cfg, work_dir: Path, **overrides):
    """transformers' TrainingArguments from the `prm` section (the PRM's loss is the pipeline's own)."""
    from transformers import TrainingArguments

    stage_args = dict(
        output_dir=str(work_dir),
        # The lengths come from the features' `length` (the sampler would otherwise read every row's input_ids).
        train_sampling_strategy="group_by_length" if cfg.group_by_length else "random",
        save_strategy="no",
        dataloader_num_workers=0,
        remove_unused_columns=False,  # the collator needs spans, labels and kinds
        **device_kwargs(),
    )
    return trl_config.build(TrainingArguments, cfg, stage_args, overrides)


def prm_train(cfg, model, tokenizer, rows: Sequence[dict], work_dir: Path, live_dir: Path) -> dict:
    """Train a PRM (`pipeline.prm.model.prm_from_policy`) in place on step-label rows; `cfg` is the `prm` section.

    Rows of source `chain` (gold chains) are trained by next-token cross-entropy, weighted `cfg.chain_weight`.
    """
    from pipeline.inference.generation import pad_id
    from pipeline.prm.model import LABEL_KINDS, collate, encode_many, path_outcome

    if not cfg.chain_weight:  # a chain row has no verdict loss: with no cross-entropy it would train nothing
        rows = [r for r in rows if r["source"] != "chain"]
    features, too_long, question_index = [], 0, {}
    encoded = encode_many(tokenizer, [r["prompt"] for r in rows], [r["steps"] for r in rows])
    for r, (ids, spans) in zip(rows, encoded):
        if len(ids) > cfg.max_length:
            too_long += 1
            continue
        features.append({"input_ids": ids, "spans": spans, "line_labels": list(r["labels"]),
                         "kind": LABEL_KINDS[r["source"]], "length": len(ids)})
        if cfg.pair_weight:  # a question's sampled paths and its gold chain share its id
            features[-1]["question"] = question_index.setdefault(r["id"], len(question_index))
            features[-1]["outcome"] = path_outcome(r["steps"], r["labels"], r["source"])
    args = prm_args(cfg, work_dir, **trackers.arguments(live_dir))
    before = snapshot(model)
    trainer = PRMTrainer(model=model, args=args, train_dataset=Dataset.from_list(features),
                         data_collator=lambda batch: collate(batch, pad_id(tokenizer)),
                         callbacks=[dvclive_callback(live_dir)], chain_weight=cfg.chain_weight,
                         pair_weight=cfg.pair_weight)
    start = time.perf_counter()
    result = checkpoints.train(trainer, cfg)
    seconds = time.perf_counter() - start
    sharding.unshard(trainer, model)
    return {
        "paths": len(features),
        "lines": sum(len(f["spans"]) for f in features),
        "too_long": too_long,
        "train_loss": round(result.training_loss, 4),
        "steps": result.global_step,
        "train_seconds": round(seconds, 1),
        **changed(before, model),
        **world(trainer),
    }
