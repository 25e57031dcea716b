"""Every TRL training run goes through `train`: a divergence guard, checkpoints keyed to the run, resume.

- **Guard.** A non-finite training loss (checked on every micro-batch, before the optimizer sees it) or
  gradient norm (before every optimizer step) stops training with `Diverged`, naming the step. The model in
  memory is then never saved (the stage's output folder is discarded), and the last checkpoint stays.
  Transformers' own `logging_nan_inf_filter` would otherwise drop NaN losses from the logs and train on.
- **Checkpoints** (`repro.checkpoint_steps` > 0): the trainer's own, every N optimizer steps, in
  `.checkpoints/<stage>-<key>/checkpoint-<step>` beside (never inside) the DVC outputs. The key hashes what
  makes the run: the stage's params section, the trainer's arguments, the training data's fingerprint and
  the starting weights, so a changed stage never resumes an old run. The checkpoint folder is removed when
  the stage has completed (`flows.run_stage`), kept when it fails.
- **Resume** (`repro.resume`): a run whose key has a complete checkpoint (its `trainer_state.json`, written
  last, parses) continues from the newest: transformers restores weights (safetensors), optimizer,
  scheduler and RNG states (loaded with `torch.load(weights_only=True)`) and skips the batches already
  trained, so the remaining steps see the same data in the same order. Each checkpoint also holds the sum
  of the step losses so far (`LOSS_FILE`): transformers averages `training_loss` over the resumed steps only,
  so `train` puts the earlier steps back and a resumed run reports an uninterrupted one's `train_loss`.
  And each holds the CPU RNG state at its epoch's start (`EPOCH_RNG_FILE`): the length-grouped sampler draws an
  epoch's order from torch's global RNG as the epoch's iteration starts, while transformers restores the
  checkpoint's RNG only after skipping the trained batches, so a run resumed past its first epoch would otherwise
  train the rest of that epoch in another order (`_EpochOrder`). The same file holds, for a sampler that keeps a
  generator of its own (TRL's RepeatSampler, GRPO's), that generator's state at the epoch's start: a resumed process's
  fresh one would give the resumed epoch the first epoch's order, training some prompts twice and others never.
  And each holds, per rank, what the run keeps in memory (`STATE_FILE`, `_RunState`): the log window open at the
  checkpoint (the loss summed since the last log and TRL's per-step values that its next log averages, which the
  final metrics read from the last log: GRPO's `reward_last` and `kl_last`, DPO's `reward_accuracy_last`), TRL's
  running token count, and the objects a caller names in `train(..., state=...)` (GRPO's guided-replay counts,
  summed over the whole run). A run resumed from its last checkpoint (killed after training, before the stage's
  outputs were in place) trains no step (`_no_step_past_the_end`) and reports the whole run's metrics.

Proven by killing a real run (`PIPELINE_FAULT=kill@step:N`) after a checkpoint and running it again, against an
uninterrupted run of the same settings: for SFT in tests/faults/test_resume.py (killed in the first epoch and in
the second: exactly the remaining steps, each step's loss, `train_loss`), and for GRPO with guided replay, DPO and
the PRM trainer in tests/faults/test_resume_rl.py (killed in the second epoch with the last log window open:
exactly the remaining steps, each on the same batch with the same loss, GRPO's prompts, rollouts, rewards and
replay counts at every step, every log, the final weights bit for bit and the metrics, timings aside; and resumed
from the last checkpoint: no step, the same weights and metrics). Not proven by a test: TBRM and logit
distillation (through the same `train`), and a resume on several ranks (each rank saves and restores its own
state). A kill between transformers' `trainer_state.json` and this module's files leaves a checkpoint that
`latest` takes as complete without them: that resume logs what it could not restore.

Out of scope: the custom loops of `pipeline/training/drills.py` (the table drills, a few seconds each) neither
checkpoint nor resume; they re-run from their start.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import SaveStrategy

from pipeline.core import faults, sharding
from pipeline.core.io import StageFailed
from pipeline.core.params import given
from pipeline.training.params import ReproConfig

ROOT = Path(".checkpoints")
KEEP = 2  # checkpoints kept per run: the newest may be half-written when a kill lands inside a save
LOSS_FILE = "pipeline_loss_sum.json"  # in each checkpoint: the sum of its steps' losses, for `train_loss`
EPOCH_RNG_FILE = "pipeline_epoch_rng.pt"  # in each checkpoint: its epoch and the CPU RNG state at that epoch's start
STATE_FILE = "pipeline_state-{rank}.json"  # in each checkpoint, per rank: the open log window and `train`'s `state`

# TrainingArguments that say where a run writes (a stage's temporary folder carries its PID) or which trackers it
# reports to (the `tracking` section), not how it trains: left out of the run's key, and of the arguments dvclive
# records beside the curves (training.py)
PLACE_ARGS = ("output_dir", "logging_dir", "run_name", "report_to", "project")

_finished: list[Path] = []  # checkpoint folders of runs that trained to the end, removed when the stage completes


class Diverged(StageFailed):
    """The loss or gradient norm became NaN or infinite; the message names the step."""


def train(trainer, stage_cfg: Any, label: str | None = None, state: dict[str, Any] | None = None):
    """`trainer.train()` guarded, checkpointed and resumed as `repro` says; returns its TrainOutput.

    `state`: name -> an object of the run's own whose `state_dict()` (JSON) goes into every checkpoint and whose
    `load_state_dict()` gets it back on resume (GRPO's guided-replay counts)."""
    from pipeline.core.phases import current_stage

    label = label or (os.environ.get("DVC_STAGE") or current_stage or "run").replace("@", "-")
    repro = given(ReproConfig)
    folder = None
    resume_from = None
    if repro.checkpoint_steps:
        folder = ROOT / f"{label}-{run_key(trainer, stage_cfg)[:16]}"
        args = trainer.args
        args.output_dir = str(folder)
        args.save_strategy = SaveStrategy.STEPS
        args.save_steps = repro.checkpoint_steps
        args.save_total_limit = KEEP
        args.save_only_model = False
        if repro.resume:
            resume_from = latest(folder)
    earlier = _loss_sum(resume_from) if resume_from is not None else 0.0
    losses = guard(trainer, label, folder)
    run_state = None
    if folder is not None:
        trainer.add_callback(_SaveLossSum(losses, earlier))
        trainer.add_callback(_EpochOrder(_epoch_rng(resume_from) if resume_from is not None else None))
        run_state = _RunState(trainer, state or {}, _saved_state(resume_from, trainer) if resume_from else None)
        trainer.add_callback(run_state)
    if resume_from is not None:
        _log(f"{label}: resuming from {resume_from} (step {_step_of(resume_from)})")
        _no_step_past_the_end(trainer)
    result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if folder is not None:
        _finished.append(folder)
    if resume_from is not None and earlier is not None and result.global_step:
        # transformers' mean divides the losses of this call, and the open log window's that `_RunState` put back
        # (already in `earlier`), by this call's steps only (global_step minus the checkpoint's step; at least 0.001,
        # a resume from the run's last checkpoint training none)
        now = max(result.global_step - _step_of(resume_from), 0.001)
        summed = result.training_loss * now - (run_state.carried_loss if run_state is not None else 0.0)
        result = result._replace(training_loss=(earlier + summed) / result.global_step)
    return result


def _no_step_past_the_end(trainer) -> None:
    """A run resumed from its last checkpoint trains no step. transformers checks `max_steps` only after a step: when
    the last step falls inside an epoch (fractional `num_train_epochs`, or `max_steps` that no epoch ends at), it
    would skip that epoch's trained batches and train the next one, a step the uninterrupted run never took (a stage
    killed after training, before its outputs were in place, then runs again). So an epoch that begins with every
    step trained is not run."""
    run_epoch = getattr(trainer, "_run_epoch", None)
    if run_epoch is None:  # another transformers: its own loop decides
        return

    def checked_epoch(*args, **kwargs):
        if 0 < trainer.state.max_steps <= trainer.state.global_step:
            trainer.control.should_training_stop = True
            return None
        return run_epoch(*args, **kwargs)

    trainer._run_epoch = checked_epoch


def _loss_sum(checkpoint: Path) -> float | None:
    """The sum of the step losses up to `checkpoint` (None: a checkpoint saved before this file existed, whose
    resumed run then reports transformers' mean over the resumed steps)."""
    try:
        return float(json.loads((checkpoint / LOSS_FILE).read_text())["loss_sum"])
    except (OSError, ValueError, KeyError, TypeError):
        _log(f"{checkpoint} holds no {LOSS_FILE}: train_loss will average the resumed steps only")
        return None


class _SaveLossSum(TrainerCallback):
    """Writes `earlier` plus this call's step losses into every checkpoint (global rank 0; the loss is its own,
    as transformers' final mean is)."""

    def __init__(self, losses: list, earlier: float | None) -> None:
        self.losses, self.earlier = losses, earlier

    def on_save(self, args, state, control, **kwargs):
        if self.earlier is None or not state.is_world_process_zero:
            return
        total = self.earlier + (self.losses[0].item() if self.losses else 0.0)
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}" / LOSS_FILE
        path.write_text(json.dumps({"loss_sum": total, "step": state.global_step}))


def _epoch_rng(checkpoint: Path) -> dict | None:
    try:
        return torch.load(checkpoint / EPOCH_RNG_FILE, weights_only=True)
    except (OSError, RuntimeError, EOFError):  # saved before this file existed: the order may differ past epoch 1
        _log(f"{checkpoint} holds no {EPOCH_RNG_FILE}: a resumed epoch after the first may see its batches in "
             "another order")
        return None


class _EpochOrder(TrainerCallback):
    """Keeps the CPU RNG state at each epoch's start (before its sampler draws the order) for the checkpoints, and
    on resume puts the saved one back at the start of that same epoch; transformers then skips the trained batches
    of the same order and restores the checkpoint's own RNG state for the steps that remain.

    The same for a sampler that draws from a generator of its own (TRL's RepeatSampler, GRPO's: seeded once when
    the trainer is built, one permutation drawn per epoch): a resumed process's fresh generator would give the
    resumed epoch the first epoch's order, training prompts again that the epoch already trained and skipping
    others. transformers neither saves it nor replays the earlier epochs' draws."""

    def __init__(self, restore: dict | None) -> None:
        self.restore, self.start = restore, None

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):
        batches = len(train_dataloader) if train_dataloader is not None else 0
        per_epoch = max(-(-batches // args.gradient_accumulation_steps), 1)  # optimizer steps, as transformers counts
        epoch = state.global_step // per_epoch
        generator = _sampler_generator(train_dataloader)
        if self.restore is not None and int(self.restore["epoch"]) == epoch:
            torch.set_rng_state(self.restore["cpu"])
            if generator is not None and self.restore.get("sampler") is not None:
                generator.set_state(self.restore["sampler"])
        self.restore = None  # only the resumed epoch: a checkpoint at an epoch's end restores its own state
        self.start = {"epoch": epoch, "cpu": torch.get_rng_state(),
                      "sampler": generator.get_state() if generator is not None else None}

    def on_save(self, args, state, control, **kwargs):
        if self.start is not None and state.is_world_process_zero:
            torch.save(self.start, Path(args.output_dir) / f"checkpoint-{state.global_step}" / EPOCH_RNG_FILE)


def _sampler_generator(dataloader) -> torch.Generator | None:
    """The torch.Generator the training sampler draws its order from, if it keeps one (under accelerate's
    DataLoaderShard: its batch sampler's sampler)."""
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None) or getattr(dataloader, "sampler", None)
    generator = getattr(sampler, "generator", None)
    return generator if isinstance(generator, torch.Generator) else None


class _RunState(TrainerCallback):
    """What a run keeps in memory beyond the trainer's own checkpoint, saved into each checkpoint by every rank
    (`STATE_FILE`) and put back on resume:

    - the open log window: the loss summed since the last log (transformers' `_tr_loss`), that log's step, and the
      per-step values TRL averages into its next log (`_metrics`). A resumed run starts them empty, so its first
      log would average only the steps it trained itself; when that is the run's last log, the final metrics that
      read it (GRPO's `reward_last`, `kl_last`, DPO's `reward_accuracy_last`) would differ from an uninterrupted run's.
    - TRL's running count of trained tokens (`_total_train_tokens`, logged as `num_tokens`), else counted from 0;
    - `state`: `train`'s objects of the run's own (GRPO's guided-replay counts, summed over the whole run).

    The trainer's private attributes are read where this transformers / TRL has them and skipped where not."""

    def __init__(self, trainer, objects: dict[str, Any], saved: dict | None) -> None:
        self.trainer, self.objects, self.saved = trainer, objects, saved
        self.carried_loss = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        # after transformers has reset the log window for this call, before the first step
        if self.saved is None:
            return
        t, window = self.trainer, self.saved.get("window") or {}
        if "loss" in window and isinstance(getattr(t, "_tr_loss", None), torch.Tensor):
            t._tr_loss += window["loss"]
            t._globalstep_last_logged = int(window["last_logged"])
            self.carried_loss = float(window["loss"])
        if isinstance(getattr(t, "_metrics", None), dict) and "train" in t._metrics:
            t._metrics["train"].update({k: list(v) for k, v in (window.get("metrics") or {}).items()})
        if self.saved.get("total_train_tokens") is not None and hasattr(t, "_total_train_tokens"):
            t._total_train_tokens = self.saved["total_train_tokens"]
        for name, obj in self.objects.items():
            if name in self.saved.get("objects", {}):
                obj.load_state_dict(self.saved["objects"][name])
            else:
                _log(f"the checkpoint holds no state of {name}: it starts over")
        self.saved = None

    def on_save(self, args, state, control, **kwargs):
        t = self.trainer
        window = {"last_logged": getattr(t, "_globalstep_last_logged", state.global_step)}
        if isinstance(getattr(t, "_tr_loss", None), torch.Tensor):
            window["loss"] = t._tr_loss.detach().float().sum().item()
        if isinstance(getattr(t, "_metrics", None), dict) and "train" in t._metrics:
            window["metrics"] = {k: [None if x is None else float(x) for x in v]
                                 for k, v in t._metrics["train"].items()}
        saved = {"step": state.global_step, "window": window,
                 "total_train_tokens": getattr(t, "_total_train_tokens", None),
                 "objects": {name: obj.state_dict() for name, obj in self.objects.items()}}
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}" / STATE_FILE.format(rank=args.process_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(saved))


def _saved_state(checkpoint: Path, trainer) -> dict | None:
    """This rank's `STATE_FILE` in `checkpoint` (None: saved before it existed, or by another number of ranks)."""
    try:
        return json.loads((checkpoint / STATE_FILE.format(rank=trainer.args.process_index)).read_text())
    except (OSError, ValueError):
        _log(f"{checkpoint} holds no {STATE_FILE.format(rank=trainer.args.process_index)}: the first log after "
             "resuming averages the resumed steps only, and the run's own counts (guided replay) start over")
        return None


def stage_completed() -> None:
    """The stage's outputs are in place: its checkpoints are no longer needed."""
    while _finished:
        shutil.rmtree(_finished.pop(), ignore_errors=True)


def run_key(trainer, stage_cfg: Any) -> str:
    """sha256 of the stage's params, the trainer's arguments (where it saves and what it reports to aside: a run
    resumes with a tracker added), the training data and the starting weights."""
    digest = hashlib.sha256()
    params = stage_cfg.model_dump(mode="json") if hasattr(stage_cfg, "model_dump") else stage_cfg
    args = {k: v for k, v in trainer.args.to_dict().items()
            if k not in PLACE_ARGS and not k.startswith(("save_", "resume"))}
    digest.update(json.dumps({"params": params, "args": args}, sort_keys=True, default=str).encode())
    data = trainer.train_dataset
    digest.update(str(getattr(data, "_fingerprint", None) or len(data)).encode())
    # whole tensors, the same key on every rank: a phase after one that left FSDP's shards, or a model loaded
    # partitioned (ZeRO-3) after a trainer
    for name, tensor in sharding.whole_tensors(trainer.model):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def latest(folder: Path) -> Path | None:
    """The newest complete checkpoint in `folder` (None: none)."""
    done = []
    for path in folder.glob("checkpoint-*") if folder.is_dir() else ():
        try:
            json.loads((path / "trainer_state.json").read_text())
        except (OSError, ValueError):
            continue  # killed while saving
        done.append(path)
    return max(done, key=_step_of, default=None)


def _step_of(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[1])


def guard(trainer, label: str, folder: Path | None) -> list:
    """Stop `trainer` with `Diverged` at the first non-finite loss or gradient norm (and host the fault hooks
    `kill@step:N` and `nan@step:N`). Returns a list that holds, once a step has run, the running sum of the
    micro-batch losses on the device (what transformers sums into `training_loss`; no sync per step)."""
    original = trainer.training_step
    running: list = []

    def checked_step(*args, **kwargs):
        step = trainer.state.global_step + 1
        faults.at(f"step:{step}")
        if faults.armed(f"step:{step}") == "nan":
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(float("nan"))
        loss = original(*args, **kwargs)
        if not torch.isfinite(loss.detach()).all():
            raise Diverged(_diverged(label, "loss", loss.detach().float().mean().item(), step, folder))
        running[:] = [running[0] + loss.detach().float() if running else loss.detach().float()]
        return loss

    trainer.training_step = checked_step
    trainer.add_callback(_FiniteGradients(label, folder))
    return running


class _FiniteGradients(TrainerCallback):
    def __init__(self, label: str, folder: Path | None) -> None:
        self.label, self.folder = label, folder

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads = [p.grad.detach() for p in model.parameters() if p.grad is not None] if model is not None else []
        if not grads:
            return
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
        if not torch.isfinite(norm):
            raise Diverged(_diverged(self.label, "gradient norm", norm.item(), state.global_step + 1, self.folder))


def _diverged(label: str, what: str, value: float, step: int, folder: Path | None) -> str:
    kept = latest(folder) if folder is not None else None
    where = (f"the last good checkpoint, {kept}, is kept" if kept is not None else
             "no checkpoint was saved before it (repro.checkpoint_steps)")
    return (f"{label}: training diverged: the {what} is {value} at optimizer step {step}; nothing was saved as "
            f"the stage's output and {where}. Lower the learning rate or check the data")


def _log(message: str) -> None:
    from pipeline.core.phases import stage_logger

    stage_logger().info(message)
