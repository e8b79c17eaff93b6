"""FC² example job: the digits CNN of ``examples/digits_cnn`` trained with PyTorch's ``DistributedDataParallel``.

Every node of an FC² ``ddp`` cluster runs ``python -m fc2_digits_torch.main --key=value ...`` with torchrun's
variables (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) set, so it joins the process
group as any script written for ``torchrun`` does: ``dist.init_process_group(backend, init_method="env://")``, the
backend from ``FC2_DIST_BACKEND`` (``gloo`` on CPU nodes, ``nccl`` on GPU ones). Each rank trains on its own slice of
every epoch (``DistributedSampler``); DDP averages the gradients every step, so one step is one synchronous update
over ``batch_size × WORLD_SIZE`` examples, as under TensorFlow's ``mirrored``. Without ``WORLD_SIZE``: one process, no
process group (handy for a quick local test). See ``examples/README.md`` for the whole contract.

Rank 0 prints the ``FC2_PROGRESS`` lines, evaluates on the test split and writes ``model.pt``
(the state_dict), ``model.pt2`` (the exported program: ``torch.export``) and ``metrics.json`` to ``FC2_OUTPUT_DIR``;
every rank waits for it at a final barrier and exits 0.

Checkpoints (``FC2_CHECKPOINT_DIR``, rank 0 only: DDP keeps every rank's weights equal): the model, the optimizer and
the epochs done are saved with ``torch.save`` at every epoch's end, and at the next progress line when
``$FC2_CHECKPOINT_DIR/CHECKPOINT_NOW`` appears (which is then deleted), as ``ckpt-<step>.pt``; the index file
``checkpoint`` then names it, as TensorFlow's does (both written to a temporary name and renamed into place: the node
agent ships the checkpoint the index names once it is whole). The one before is removed. With ``FC2_RESTORE_FROM``
set, every rank loads the checkpoint its index names and goes on from the steps it holds. ``FC2_TRAIN_SECONDS`` (set
on Scala-Opt's profiling run and explore's trials, which save no checkpoint): train at least that many seconds, adding
whole epochs until then.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, TensorDataset

PROGRESS_PREFIX = "FC2_PROGRESS"
CHECKPOINT_NOW = "CHECKPOINT_NOW"  # the platform's request (a spot interruption notice) to checkpoint at once
CHECKPOINT_INDEX = "checkpoint"  # names the newest whole checkpoint, in TensorFlow's format: what the agent ships
INDEX_LINE = re.compile(r'^model_checkpoint_path: "([^"/\\]+)"$', re.MULTILINE)
MODEL_FILE, EXPORTED_FILE, METRICS_FILE = "model.pt", "model.pt2", "metrics.json"
EVAL_BATCH = 512

# A 1-channel Conv2d's weight gradient comes with a stride of 1 on its size-1 axis where DDP's bucket view has 9:
# the same memory layout (a size-1 axis's stride is never used), which DDP warns of at every run all the same.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")


# --------------------------------------------------------------------------------------------------- arguments / env
def _optional_int(value: str) -> int | None:
    """``--steps_per_epoch=`` / ``none`` / ``0`` all mean "derive it from the data size"."""
    if str(value).strip().lower() in ("", "none", "null", "auto", "0"):
        return None
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return number


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return number


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The TensorFlow example's parameters, with the same defaults; any other is ignored (the platform passes all)."""
    parser = argparse.ArgumentParser(prog="fc2_digits_torch.main", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=_positive_int, default=2)
    parser.add_argument("--batch_size", type=_positive_int, default=32, help="examples per rank per step")
    parser.add_argument("--learning_rate", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument(
        "--steps_per_epoch", type=_optional_int, default=None, help="default: train examples // global batch size"
    )
    parser.add_argument("--log_every_steps", type=_positive_int, default=10, help="progress line every N steps")
    parser.add_argument("--filters", type=_positive_int, default=8, help="Conv2d filters")
    parser.add_argument("--seed", type=int, default=42, help="weight-initialisation and shuffle seed")
    # PyTorch's own: its intra-op threads (torch.set_num_threads). Left to torch (0), a process takes one a core of the
    # machine; nodes that share a machine's cores (the lab's, local ones) then wait on each other's OpenMP threads.
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (default 0: torch's choice)")
    return parser.parse_known_args(argv)


@dataclass(frozen=True)
class Fc2Env:
    rank: int  # RANK: this process's rank, 0 .. world_size - 1
    world_size: int  # WORLD_SIZE: the processes training together (1: no process group)
    local_rank: int  # LOCAL_RANK: this process's GPU on a GPU node
    distributed: bool  # whether torchrun's variables are there (then init_process_group)
    backend: str  # FC2_DIST_BACKEND: "gloo" (CPU) or "nccl" (GPU)
    is_chief: bool  # rank 0: prints progress, evaluates, writes the outputs
    data: str  # FC2_DATA: the dataset .npz
    output_dir: str  # FC2_OUTPUT_DIR: the chief's results, each file an artifact
    train_seconds: float = 0.0  # FC2_TRAIN_SECONDS: train at least this long whatever --epochs says (0: as it says)
    checkpoint_dir: str = ""  # FC2_CHECKPOINT_DIR: where checkpoints go ("": none are written)
    restore_from: str = ""  # FC2_RESTORE_FROM: a checkpoint directory to resume from ("": start from scratch)


def read_env(environ: dict | None = None) -> Fc2Env:
    environ = os.environ if environ is None else environ
    rank, world_size = int(environ.get("RANK") or 0), int(environ.get("WORLD_SIZE") or 1)
    if not 0 <= rank < world_size:
        raise SystemExit(f"RANK must be in 0 .. WORLD_SIZE - 1, not RANK={rank} WORLD_SIZE={world_size}")
    try:
        train_seconds = float(environ.get("FC2_TRAIN_SECONDS") or 0)
    except ValueError:
        train_seconds = -1.0
    if not 0 <= train_seconds < math.inf:
        raise SystemExit(f"FC2_TRAIN_SECONDS must be a number of seconds >= 0, not {environ['FC2_TRAIN_SECONDS']!r}")
    return Fc2Env(
        rank=rank,
        world_size=world_size,
        local_rank=int(environ.get("LOCAL_RANK") or 0),
        distributed="WORLD_SIZE" in environ,
        backend=environ.get("FC2_DIST_BACKEND") or "gloo",
        # Rank 0 rather than FC2_IS_CHIEF, which is a node's: a GPU node runs a process per GPU, one of them rank 0.
        is_chief=rank == 0,
        data=environ.get("FC2_DATA") or "",
        output_dir=environ.get("FC2_OUTPUT_DIR") or os.path.join(os.getcwd(), "fc2_output"),
        train_seconds=train_seconds,
        checkpoint_dir=environ.get("FC2_CHECKPOINT_DIR") or "",
        restore_from=environ.get("FC2_RESTORE_FROM") or "",
    )


def log(message: str) -> None:
    print(f"[fc2_digits_torch] {message}", flush=True)


# ------------------------------------------------------------------------------------------------------------ data
@dataclass
class Dataset:
    """The four arrays of the dataset contract, as tensors: images (n, c, h, w) float32, labels (n,) int64."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(h, w, c), as the TensorFlow example reports it."""
        _, c, h, w = self.x_train.shape
        return int(h), int(w), int(c)

    @property
    def num_classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def load_data(path: str) -> Dataset:
    """The .npz of ``FC2_DATA`` (x_* shaped (n, h, w, c) or (n, h, w), integer labels), channels moved first."""
    if not path or not os.path.exists(path):
        raise SystemExit(f"FC2_DATA must point to an .npz dataset file (got {path!r})")
    with np.load(path) as npz:
        arrays = {key: npz[key] for key in ("x_train", "y_train", "x_test", "y_test")}
    tensors = {}
    for key in ("x_train", "x_test"):
        x = arrays[key].astype("float32", copy=False)
        if x.ndim == 3:  # (n, h, w) grayscale without a channel axis
            x = x[..., np.newaxis]
        if x.ndim != 4:
            raise SystemExit(f"{key} must be shaped (n, h, w, c), got {x.shape}")
        tensors[key] = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    for key in ("y_train", "y_test"):
        tensors[key] = torch.from_numpy(arrays[key].reshape(-1).astype("int64"))
    return Dataset(**tensors)


def batches(data: Dataset, env: Fc2Env, batch_size: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's batches, for ever: each pass over the data shuffled anew (the same order on every rank, from the
    seed and the pass) and split between the ranks by DistributedSampler, the remainder dropped."""
    sampler = DistributedSampler(
        TensorDataset(data.x_train, data.y_train), env.world_size, env.rank, shuffle=True, seed=seed, drop_last=True
    )
    if len(sampler) < batch_size:
        raise SystemExit(f"--batch_size={batch_size} is more than this rank's {len(sampler)} training examples")
    for data_pass in itertools.count():
        sampler.set_epoch(data_pass)
        indices = torch.tensor(list(sampler))
        for start in range(0, len(indices) - batch_size + 1, batch_size):
            chosen = indices[start : start + batch_size]
            yield data.x_train[chosen], data.y_train[chosen]


# ----------------------------------------------------------------------------------------------------------- model
def build_model(input_shape: tuple[int, int, int], num_classes: int, filters: int, seed: int) -> nn.Module:
    """Conv(3x3, same padding) -> ReLU -> MaxPool(2) -> Linear: the TensorFlow example's CNN, Glorot-uniform weights
    and zero biases as Keras initialises them, from the seed. Outputs logits."""
    h, w, c = input_shape
    generator = torch.Generator().manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(c, filters, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(filters * (h // 2) * (w // 2), num_classes),
    )
    for layer in (model[0], model[4]):
        nn.init.xavier_uniform_(layer.weight, generator=generator)
        nn.init.zeros_(layer.bias)
    return model


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> tuple[float, float]:
    """Test loss and accuracy, computed in this process alone (the chief's copy of the weights)."""
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(x), EVAL_BATCH):
        xb, yb = x[start : start + EVAL_BATCH].to(device), y[start : start + EVAL_BATCH].to(device)
        logits = model(xb)
        loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(dim=1) == yb).sum())
    model.train()
    n = max(1, len(x))
    return loss_sum / n, correct / n


# -------------------------------------------------------------------------------------------- progress and timing
class ProgressTracker:
    """Turns per-step losses (means over the global batch) into FC2_PROGRESS lines: one every ``log_every_steps``
    steps and one at every epoch's end. ``epoch`` is the 1-based epoch the latest step belongs to; ``step``/``steps``
    count the whole run."""

    def __init__(self, epochs: int, steps_per_epoch: int, enabled: bool):
        self.epochs, self.steps_per_epoch, self.enabled = epochs, steps_per_epoch, enabled
        self.total = epochs * steps_per_epoch
        self.step = self.resumed_at = 0
        self.window: list[float] = []
        self.epoch_losses: list[float] = []
        self.epoch_mean_losses: list[float] = []

    def resume(self, step: int) -> None:
        """Go on from `step` (a restored checkpoint's): the steps before it are done."""
        self.step = self.resumed_at = step

    def add(self, losses: list[float]) -> None:
        """The losses of the steps since the last call, which ended at a log point or an epoch's end."""
        self.step += len(losses)
        self.window += losses
        self.epoch_losses += losses
        fields = {"epoch": math.ceil(self.step / self.steps_per_epoch), "epochs": self.epochs}
        fields |= {"step": self.step, "steps": self.total, "loss": round(float(np.mean(self.window)), 5)}
        if self.step % self.steps_per_epoch == 0:
            self.epoch_mean_losses.append(float(np.mean(self.epoch_losses)))
            fields |= {"epoch_end": True, "epoch_loss": round(self.epoch_mean_losses[-1], 5)}
            self.epoch_losses = []
        if self.enabled:
            print(f"{PROGRESS_PREFIX} {json.dumps(fields, separators=(', ', ': '))}", flush=True)
        self.window = []

    def steps_to_report(self, log_every_steps: int) -> int:
        """Steps until the next progress line: the next multiple of ``log_every_steps`` or the epoch's end."""
        in_epoch = self.step % self.steps_per_epoch
        return min(log_every_steps - self.step % log_every_steps, self.steps_per_epoch - in_epoch)

    def add_epoch(self) -> None:
        """One more epoch than planned (FC2_TRAIN_SECONDS): progress lines count it from now on."""
        self.epochs += 1
        self.total += self.steps_per_epoch


@dataclass
class Timing:
    """The training loop's clock. Its first step sets up DDP's buckets and warms the kernels: that start-up is timed
    apart (``startup_s``), so that ``epoch_time_s`` is the steady state's, which is what more or fewer ranks change."""

    started: float = field(default_factory=time.monotonic)
    warm_at: float = 0.0  # when the first step ended (0: not yet)
    ended: float = 0.0
    saving: float = 0.0  # seconds spent saving checkpoints, left out of the figures: they are not training

    @contextlib.contextmanager
    def checkpointing(self):
        started = time.monotonic()
        try:
            yield
        finally:
            self.saving += time.monotonic() - started

    @property
    def duration(self) -> float:
        return self.ended - self.started - self.saving

    def metrics(self, steps_run: int, steps_per_epoch: int) -> dict:
        """``duration_s`` (the whole loop), ``startup_s`` and, where steps ran after the first, ``epoch_time_s``: their
        mean step time × steps per epoch."""
        figures = {"duration_s": round(self.duration, 3), "checkpoint_s": round(self.saving, 3)}
        if not self.warm_at:  # no step ran (a checkpoint of the last epoch restored)
            return figures
        figures["startup_s"] = round(self.warm_at - self.started, 3)
        if steps_run > 1:
            step_s = (self.ended - self.warm_at - self.saving) / (steps_run - 1)
            figures["epoch_time_s"] = round(step_s * steps_per_epoch, 4)
        return figures


# ------------------------------------------------------------------------------------------------------ checkpoints
class Checkpoints:
    """The run's checkpoints in ``FC2_CHECKPOINT_DIR``, written by the chief alone (every rank holds the same weights):
    ``ckpt-<step>.pt`` (model, optimizer, epochs done — a fraction when saved mid-epoch, since a resumed run on another
    number of ranks has another number of steps an epoch), then the index naming it; the one before is removed. No
    checkpoint directory, or a run for FC2_TRAIN_SECONDS (a measurement, never resumed): nothing is saved."""

    def __init__(self, env: Fc2Env, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        saving = env.is_chief and env.checkpoint_dir and not env.train_seconds
        self.directory = env.checkpoint_dir if saving else ""
        self.last = ""

    def restore(self, directory: str, steps_per_epoch: int) -> int:
        """Load the checkpoint `directory`'s index names; the step (of this run's epochs) to go on from."""
        try:
            with open(os.path.join(directory, CHECKPOINT_INDEX)) as index:
                name = INDEX_LINE.search(index.read())
        except OSError:
            name = None
        if name is None:
            raise SystemExit(f"FC2_RESTORE_FROM={directory!r} holds no checkpoint index naming a checkpoint")
        state = torch.load(os.path.join(directory, f"{name.group(1)}.pt"), map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        log(f"restored {name.group(1)}: {state['epochs_done']:g} epochs done")
        return round(state["epochs_done"] * steps_per_epoch)

    def asked(self) -> bool:
        """Whether the platform asks for a checkpoint now (CHECKPOINT_NOW in the chief's checkpoint directory)."""
        return bool(self.directory) and os.path.exists(os.path.join(self.directory, CHECKPOINT_NOW))

    def save(self, step: int, steps_per_epoch: int) -> None:
        if not self.directory:
            return
        name = f"ckpt-{step}"
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        state["epochs_done"] = step / steps_per_epoch
        _write_atomically(self.directory, f"{name}.pt", lambda path: torch.save(state, path))
        index = f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n'
        _write_atomically(self.directory, CHECKPOINT_INDEX, lambda path: _write_text(path, index))
        if self.last and self.last != name:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.directory, f"{self.last}.pt"))
        self.last = name
        with contextlib.suppress(FileNotFoundError):  # saved: a request is answered
            os.remove(os.path.join(self.directory, CHECKPOINT_NOW))
        log(f"checkpoint {name} at step {step}")


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as out:
        out.write(text)


def _write_atomically(directory: str, name: str, write) -> None:
    """`write(path)` to a temporary name, then renamed into place: a reader sees the old file or the whole new one."""
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".{name}.tmp")
    write(temporary)
    os.replace(temporary, os.path.join(directory, name))


# ---------------------------------------------------------------------------------------------------------- training
def all_reduce(values: list[float], env: Fc2Env, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """The element-wise sum (or `op`) of `values` over every rank; `values` itself without a process group."""
    tensor = torch.tensor(values, dtype=torch.float64)
    if env.distributed:
        dist.all_reduce(tensor, op=op)
    return tensor


def train(args: argparse.Namespace, env: Fc2Env) -> int:
    data = load_data(env.data)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda", env.local_rank) if env.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the process group: nccl binds this process to its own GPU
    if env.distributed:
        # torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE): blocks until every rank has joined.
        dist.init_process_group(backend=env.backend, init_method="env://")
    global_batch = args.batch_size * env.world_size
    steps_per_epoch = args.steps_per_epoch or max(1, len(data.x_train) // global_batch)
    log(
        f"rank={env.rank} world_size={env.world_size} backend={env.backend if env.distributed else 'none'} "
        f"chief={env.is_chief} global_batch={global_batch} steps_per_epoch={steps_per_epoch} "
        f"input_shape={data.input_shape} classes={data.num_classes} torch={torch.__version__} "
        f"threads={torch.get_num_threads()}"
    )
    plain = build_model(data.input_shape, data.num_classes, args.filters, args.seed).to(device)
    # DDP broadcasts rank 0's weights at construction and averages the gradients across ranks in backward().
    model = DistributedDataParallel(plain, gradient_as_bucket_view=True) if env.distributed else plain
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
    checkpoints = Checkpoints(env, plain, optimizer)
    tracker = ProgressTracker(args.epochs, steps_per_epoch, enabled=env.is_chief)
    if env.restore_from:
        tracker.resume(checkpoints.restore(env.restore_from, steps_per_epoch))
    stream = batches(data, env, args.batch_size, args.seed)

    timing = Timing()
    while tracker.step < tracker.total:
        # The steps up to the next progress line, then one all-reduce of their losses: every rank calls it at the
        # same steps, and the loss costs no collective of its own every step.
        losses = []
        for _ in range(tracker.steps_to_report(args.log_every_steps)):
            xb, yb = next(stream)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb.to(device)), yb.to(device))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            timing.warm_at = timing.warm_at or time.monotonic()
        tracker.add((all_reduce(losses, env) / env.world_size).tolist())
        if tracker.step == tracker.total and env.train_seconds:
            # Every rank must run the same steps (each is an all-reduce): one more epoch when any wants it.
            wants = time.monotonic() - timing.started < env.train_seconds
            if all_reduce([float(wants)], env, dist.ReduceOp.MAX)[0] > 0:
                tracker.add_epoch()
        if tracker.step % steps_per_epoch == 0 or checkpoints.asked():
            with timing.checkpointing():
                checkpoints.save(tracker.step, steps_per_epoch)
    timing.ended = time.monotonic()

    failure = None
    if env.is_chief:
        try:
            finish(plain, args, env, data, device, tracker, global_batch, timing)
        except Exception as exc:  # still reach the barrier below, or the other ranks would wait there forever
            failure = exc
    if env.distributed:
        dist.barrier()  # no rank leaves (and closes its connections) before the chief has saved
        dist.destroy_process_group()
    if failure is not None:
        raise failure
    log(f"rank {env.rank} finished")
    return 0


def finish(model: nn.Module, args, env: Fc2Env, data: Dataset, device, tracker, global_batch: int, timing) -> None:
    """The chief: evaluate on the test split, then write model.pt, model.pt2 and metrics.json."""
    test_loss, test_acc = evaluate(model, data.x_test, data.y_test, device)
    steps_run = tracker.total - tracker.resumed_at
    metrics = (
        {
            "framework": "pytorch",
            "strategy": "ddp",
            "backend": env.backend if env.distributed else "none",
            "workers": env.world_size,
            "replicas": env.world_size,
            "epochs": tracker.epochs,  # more than --epochs where FC2_TRAIN_SECONDS asked for more
            "batch_size": args.batch_size,
            "global_batch_size": global_batch,
            "learning_rate": args.learning_rate,
            "steps": tracker.total,
            "steps_per_epoch": tracker.steps_per_epoch,
            # None when the run restored a checkpoint of its last epoch and trained no more
            "final_train_loss": tracker.epoch_mean_losses[-1] if tracker.epoch_mean_losses else None,
            "epoch_train_losses": tracker.epoch_mean_losses,
            "test_loss": test_loss,
            "test_accuracy": test_acc,
            "examples_per_s": round(steps_run * global_batch / max(timing.duration, 1e-9), 1),
            "input_shape": list(data.input_shape),
            "num_classes": data.num_classes,
            "train_examples": len(data.x_train),
            "test_examples": len(data.x_test),
            "torch_version": torch.__version__,
            "threads": torch.get_num_threads(),
        }
        | timing.metrics(steps_run, tracker.steps_per_epoch)
        | ({"train_seconds": env.train_seconds} if env.train_seconds else {})
        | ({"resumed_at_step": tracker.resumed_at} if env.restore_from else {})
    )
    os.makedirs(env.output_dir, exist_ok=True)
    model = model.cpu().eval()
    torch.save(model.state_dict(), os.path.join(env.output_dir, MODEL_FILE))
    # The model with its code, loaded by torch.export.load(...).module() without this package; any batch size. (Not
    # TorchScript, which torch deprecates.) About 2 s, after training: duration_s does not count it.
    example = data.x_test[:2].to("cpu")
    exported = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    torch.export.save(exported, os.path.join(env.output_dir, EXPORTED_FILE))
    with open(os.path.join(env.output_dir, METRICS_FILE), "w") as out:
        json.dump(metrics, out, indent=2, sort_keys=True)
        out.write("\n")
    log(f"done: test_accuracy={test_acc:.4f} metrics={json.dumps(metrics)}")


def main(argv: list[str] | None = None) -> int:
    args, unknown = parse_args(argv)
    env = read_env()
    if unknown:
        log(f"ignoring unknown arguments: {' '.join(unknown)}")
    return train(args, env)


if __name__ == "__main__":
    sys.exit(main())
