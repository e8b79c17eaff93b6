"""FC² example job: train a tiny CNN on an image-classification ``.npz`` with ``tf.distribute``.

Every node of an FC² cluster runs ``python -m fc2_digits.main --key=value ...``; what each process does depends on
the environment the platform sets (see ``examples/README.md`` for the full contract):

* ``FC2_STRATEGY=ps``: ``ps`` and ``worker`` tasks start a ``tf.distribute.Server`` and serve forever (the platform
  kills them at teardown); the ``chief`` drives training through ``ParameterServerStrategy`` +
  ``ClusterCoordinator``, evaluates, saves and exits.
* ``FC2_STRATEGY=mirrored``: every worker trains with ``MultiWorkerMirroredStrategy``; worker 0 (the chief)
  evaluates and saves; all workers exit 0.
* ``FC2_STRATEGY=local`` (or no ``TF_CONFIG`` at all): one process, default strategy; handy for a quick local test.

Checkpoints (``FC2_CHECKPOINT_DIR``): the model, the optimizer and the steps done are saved with
``tf.train.CheckpointManager`` at every epoch's end, and at once (at the next step) when ``$FC2_CHECKPOINT_DIR/
CHECKPOINT_NOW`` appears, which is then deleted; with ``FC2_RESTORE_FROM`` set, training resumes from the checkpoint
there, at the epoch after the one it holds. Without ``FC2_CHECKPOINT_DIR`` nothing is saved.

``FC2_TRAIN_SECONDS`` (set on Scala-Opt's profiling run and explore's trials, which save no checkpoint): train at least
that many seconds whatever ``--epochs`` says, adding whole epochs until then. ``metrics.json`` reports ``startup_s``
(the first round of steps, which traces and compiles the step function) apart from ``epoch_time_s`` (the steady-state
epoch time, measured after it), and ``checkpoint_s``, the time spent saving checkpoints, which neither counts.

Keras 3 ``model.fit`` does not work under either multi-worker strategy (keras-team/keras#20585), so training is a
custom loop around ``strategy.run``; the model itself is an ordinary Keras 3 model built inside ``strategy.scope()``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

PROGRESS_PREFIX = "FC2_PROGRESS"
CHECKPOINT_NOW = "CHECKPOINT_NOW"  # the platform's request (a spot interruption notice) to checkpoint at once
MODEL_FILE = "model.keras"
METRICS_FILE = "metrics.json"
EVAL_BATCH = 512


# --------------------------------------------------------------------------------------------------- arguments / env
def _optional_int(value: str) -> int | None:
    """``--steps_per_epoch=`` / ``none`` / ``0`` all mean "derive it from the data size"."""
    if value is None or str(value).strip().lower() in ("", "none", "null", "auto", "0"):
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
    parser = argparse.ArgumentParser(prog="fc2_digits.main", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=_positive_int, default=2)
    parser.add_argument("--batch_size", type=_positive_int, default=32, help="examples per replica per step")
    parser.add_argument("--learning_rate", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument(
        "--steps_per_epoch",
        type=_optional_int,
        default=None,
        help="training steps per epoch; default: train examples // global batch size",
    )
    parser.add_argument("--log_every_steps", type=_positive_int, default=10, help="progress line every N steps")
    parser.add_argument("--filters", type=_positive_int, default=8, help="Conv2D filters")
    parser.add_argument("--seed", type=int, default=42)
    # The platform passes every job parameter; ignore the ones this example does not know.
    return parser.parse_known_args(argv)


@dataclass(frozen=True)
class Fc2Env:
    strategy: str  # "ps" | "mirrored" | "local"
    role: str  # "ps" | "chief" | "worker"
    task_index: int
    is_chief: bool
    data: str
    output_dir: str
    tf_config: dict
    train_seconds: float = 0.0  # FC2_TRAIN_SECONDS: train at least this long whatever --epochs says (0: as it says)
    checkpoint_dir: str = ""  # FC2_CHECKPOINT_DIR: where checkpoints go ("": none are written)
    restore_from: str = ""  # FC2_RESTORE_FROM: a checkpoint directory to resume from ("": start from scratch)


def read_env(environ: dict | None = None) -> Fc2Env:
    environ = os.environ if environ is None else environ
    tf_config = json.loads(environ.get("TF_CONFIG") or "{}")
    task = tf_config.get("task", {})
    strategy = (environ.get("FC2_STRATEGY") or ("mirrored" if tf_config else "local")).strip().lower()
    if strategy not in ("ps", "mirrored", "local"):
        raise SystemExit(f"FC2_STRATEGY must be 'ps', 'mirrored' or 'local', not {strategy!r}")
    role = environ.get("FC2_ROLE") or task.get("type") or ("chief" if strategy == "local" else "worker")
    task_index = int(environ.get("FC2_TASK_INDEX") or task.get("index") or 0)
    if "FC2_IS_CHIEF" in environ:
        is_chief = environ["FC2_IS_CHIEF"].strip() == "1"
    else:
        is_chief = role == "chief" or (strategy != "ps" and task_index == 0)
    data = environ.get("FC2_DATA") or ""
    output_dir = environ.get("FC2_OUTPUT_DIR") or os.path.join(os.getcwd(), "fc2_output")
    try:
        train_seconds = float(environ.get("FC2_TRAIN_SECONDS") or 0)
    except ValueError:
        train_seconds = -1.0
    if not 0 <= train_seconds < math.inf:
        raise SystemExit(f"FC2_TRAIN_SECONDS must be a number of seconds >= 0, not {environ['FC2_TRAIN_SECONDS']!r}")
    return Fc2Env(
        strategy, role, task_index, is_chief, data, output_dir, tf_config, train_seconds,
        checkpoint_dir=environ.get("FC2_CHECKPOINT_DIR") or "", restore_from=environ.get("FC2_RESTORE_FROM") or "",
    )  # fmt: skip


def log(message: str) -> None:
    print(message, flush=True)


def progress(**fields) -> None:
    """One machine-readable progress line for the FC² node agent (chief only)."""
    print(f"{PROGRESS_PREFIX} {json.dumps(fields, separators=(', ', ': '))}", flush=True)


# ------------------------------------------------------------------------------------------------------------ data
@dataclass
class Dataset:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def num_classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def load_data(path: str) -> Dataset:
    if not path or not os.path.exists(path):
        raise SystemExit(f"FC2_DATA must point to an .npz dataset file (got {path!r})")
    with np.load(path) as npz:
        arrays = {key: npz[key] for key in ("x_train", "y_train", "x_test", "y_test")}
    for key in ("x_train", "x_test"):
        x = arrays[key].astype("float32", copy=False)
        if x.ndim == 3:  # (n, h, w) grayscale without a channel axis
            x = x[..., np.newaxis]
        if x.ndim != 4:
            raise SystemExit(f"{key} must be shaped (n, h, w, c), got {x.shape}")
        arrays[key] = x
    for key in ("y_train", "y_test"):
        arrays[key] = arrays[key].reshape(-1).astype("int64")
    return Dataset(**arrays)


# ----------------------------------------------------------------------------------------------------------- model
def build_model(input_shape: tuple[int, ...], num_classes: int, filters: int, seed: int):
    """Conv(3x3) -> MaxPool(2) -> Dense. Outputs logits. Builds its variables in the current strategy scope."""
    import keras

    init = keras.initializers.GlorotUniform
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.Conv2D(filters, 3, padding="same", activation="relu", kernel_initializer=init(seed)),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(num_classes, kernel_initializer=init(seed + 1)),
        ],
        name="digits_cnn",
    )


def make_train_step(strategy, model, optimizer, global_batch: int):
    """A ``tf.function`` that takes one batch from a (per-worker) distributed iterator, runs forward/backward on every
    replica with ``strategy.run`` and returns the mean loss over the global batch."""
    import tensorflow as tf

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        # Keras 3 optimizers (when created inside strategy.scope()) sum the gradients across replicas themselves.
        optimizer.apply(grads, model.trainable_variables)
        return loss

    @tf.function
    def train_step(iterator):
        per_replica_loss = strategy.run(replica_step, args=next(iterator))
        # SUM of the per-replica losses (each already scaled by 1/global_batch) = mean over the global batch.
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)

    return train_step


def evaluate(model, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Test loss and accuracy, computed in this process (reads distributed variables, runs no collectives)."""
    import tensorflow as tf

    loss_sum, correct = 0.0, 0
    for start in range(0, len(x), EVAL_BATCH):
        xb, yb = x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH]
        logits = model(xb, training=False)
        loss_sum += float(tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yb, logits=logits)))
        correct += int(np.sum(np.argmax(np.asarray(logits), axis=1) == yb))
    n = max(1, len(x))
    return loss_sum / n, correct / n


def save_outputs(model, args, data: Dataset, output_dir: str, metrics: dict) -> None:
    """Chief only: save a strategy-free copy of the model (``model.keras``) and ``metrics.json``."""
    os.makedirs(output_dir, exist_ok=True)
    # Copy the weights into a model built outside any strategy scope so the saved file holds plain variables and
    # loads anywhere with keras.models.load_model (no optimizer state: it is an inference artifact).
    plain = build_model(data.input_shape, data.num_classes, args.filters, args.seed)
    plain.set_weights([np.asarray(w) for w in model.get_weights()])
    plain.save(os.path.join(output_dir, MODEL_FILE))
    with open(os.path.join(output_dir, METRICS_FILE), "w") as fh:
        json.dump(metrics, fh, indent=2, sort_keys=True)
        fh.write("\n")


def base_metrics(args, env: Fc2Env, data: Dataset) -> dict:
    import keras
    import tensorflow as tf

    return {
        "strategy": env.strategy,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "input_shape": list(data.input_shape),
        "num_classes": data.num_classes,
        "train_examples": len(data.x_train),
        "test_examples": len(data.x_test),
        "tensorflow_version": tf.__version__,
        "keras_version": keras.__version__,
    }


def finish(model, args, env: Fc2Env, data: Dataset, tracker, global_batch: int, timing: Timing, **layout) -> None:
    """Evaluate on the test split, then save the model and metrics.json (the chief only calls this)."""
    test_loss, test_acc = evaluate(model, data.x_test, data.y_test)
    metrics = (
        base_metrics(args, env, data)
        | layout
        | {
            "epochs": tracker.epochs,  # more than --epochs where FC2_TRAIN_SECONDS asked for more
            "global_batch_size": global_batch,
            "steps": tracker.total,
            "steps_per_epoch": tracker.steps_per_epoch,
            # None when the run restored a checkpoint of its last epoch and trained no more
            "final_train_loss": tracker.epoch_mean_losses[-1] if tracker.epoch_mean_losses else None,
            "epoch_train_losses": tracker.epoch_mean_losses,
            "test_loss": test_loss,
            "test_accuracy": test_acc,
            "examples_per_s": round(
                (tracker.total - tracker.resumed_at) * global_batch / max(timing.duration, 1e-9), 1
            ),
        }
        | timing.metrics(tracker.total, tracker.steps_per_epoch)
        | ({"train_seconds": env.train_seconds} if env.train_seconds else {})
        | ({"resumed_at_step": tracker.resumed_at} if env.restore_from else {})
    )
    save_outputs(model, args, data, env.output_dir, metrics)
    log(f"[fc2_digits] done: test_accuracy={test_acc:.4f} metrics={json.dumps(metrics)}")


class ProgressTracker:
    """Turns per-step losses into FC2_PROGRESS lines. ``epoch`` is the 1-based epoch the latest step belongs to
    (so on an epoch-end line it equals the number of completed epochs); ``step``/``steps`` count the whole run."""

    def __init__(self, epochs: int, steps_per_epoch: int, enabled: bool):
        self.epochs, self.steps_per_epoch, self.enabled = epochs, steps_per_epoch, enabled
        self.total = epochs * steps_per_epoch
        self.step = 0
        self.window: list[float] = []
        self.epoch_losses: list[float] = []
        self.epoch_mean_losses: list[float] = []
        self.resumed_at = 0  # the step a restored checkpoint had reached

    def resume(self, step: int) -> None:
        """Go on from `step` (a restored checkpoint's): the steps before it are done."""
        self.step = self.resumed_at = step

    def add(self, losses: list[float], log_now: bool) -> None:
        self.step += len(losses)
        self.window += losses
        self.epoch_losses += losses
        epoch = math.ceil(self.step / self.steps_per_epoch)
        epoch_end = self.step % self.steps_per_epoch == 0
        if epoch_end:
            self.epoch_mean_losses.append(float(np.mean(self.epoch_losses)))
        if self.enabled and (log_now or epoch_end) and self.window:
            fields = {"epoch": epoch, "epochs": self.epochs, "step": self.step, "steps": self.total}
            fields["loss"] = round(float(np.mean(self.window)), 5)
            if epoch_end:
                fields["epoch_end"] = True
                fields["epoch_loss"] = round(self.epoch_mean_losses[-1], 5)
            progress(**fields)
            self.window = []
        if epoch_end:
            self.epoch_losses = []

    def add_epoch(self) -> None:
        """One more epoch than planned (FC2_TRAIN_SECONDS): progress lines count it from now on."""
        self.epochs += 1
        self.total += self.steps_per_epoch


@dataclass
class Timing:
    """The training loop's clock. Its first round of steps (one step; under ``ps`` one per worker) traces the step
    function, builds its graph and compiles it on each worker: that start-up is timed apart (``startup_s``), so that
    the epoch time (``epoch_time_s``) is the steady state's, which is what more or fewer workers change."""

    started: float = field(default_factory=time.monotonic)
    warm_steps: int = 0  # steps in the first round (0: not done yet)
    warm_at: float = 0.0  # when the first round ended
    ended: float = 0.0  # when the last step ended
    saving: float = 0.0  # seconds spent saving checkpoints, left out of the figures: they are not training

    @contextlib.contextmanager
    def checkpointing(self):
        started = time.monotonic()
        try:
            yield
        finally:
            self.saving += time.monotonic() - started

    def warmed(self, steps: int) -> None:
        self.warm_steps, self.warm_at = steps, time.monotonic()

    def stop(self) -> None:
        self.ended = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def duration(self) -> float:
        return self.ended - self.started - self.saving

    def metrics(self, steps: int, steps_per_epoch: int) -> dict:
        """``duration_s`` (the whole loop), ``startup_s`` and, where steps ran after the first round, ``epoch_time_s``:
        their mean step time × steps per epoch."""
        figures = {"duration_s": round(self.duration, 3), "checkpoint_s": round(self.saving, 3)}
        if not self.warm_steps:  # no step ran (a checkpoint of the last epoch restored)
            return figures
        figures["startup_s"] = round(self.warm_at - self.started, 3)
        if steps > self.warm_steps:
            step_s = (self.ended - self.warm_at - self.saving) / (steps - self.warm_steps)
            figures["epoch_time_s"] = round(step_s * steps_per_epoch, 4)
        return figures


# ------------------------------------------------------------------------------------------------------ checkpoints
class Checkpoints:
    """The run's checkpoints in ``FC2_CHECKPOINT_DIR``: the model, its optimizer and the epochs done (a fraction when
    saved mid-epoch), saved by ``tf.train.CheckpointManager``, the newest kept. Under MultiWorkerMirroredStrategy every
    worker must save (a save is a collective): those that are not the chief write to a directory of their own, thrown
    away. Under ParameterServerStrategy the variables live on the parameter servers, which would each write their own
    shards on their own disk: the chief does all the reading and writing instead (``experimental_io_device``). Without
    ``FC2_CHECKPOINT_DIR`` (the bundle run outside the platform) nothing is saved."""

    def __init__(self, env: Fc2Env, model, optimizer):
        import tensorflow as tf

        # Epochs rather than steps: a resumed run with another worker count has another number of steps an epoch.
        self.epochs_done = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epochs_done=self.epochs_done)
        self.manager = None
        self.asked_file = ""
        chief_io = "/job:chief/replica:0/task:0/device:CPU:0" if env.strategy == "ps" else None
        self.options = tf.train.CheckpointOptions(experimental_io_device=chief_io)
        # A run that trains for FC2_TRAIN_SECONDS measures (Scala-Opt's profiling, explore's trials) and is never
        # resumed: its saves would only be counted as its training time.
        if env.checkpoint_dir and not env.train_seconds:
            directory = env.checkpoint_dir
            if env.is_chief:
                self.asked_file = os.path.join(directory, CHECKPOINT_NOW)
            else:
                directory = tempfile.mkdtemp(prefix="fc2-checkpoint-")
                atexit.register(shutil.rmtree, directory, True)
            self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=1)

    def restore(self, directory: str, steps_per_epoch: int) -> int:
        """Load the newest checkpoint in `directory`; the step (of this run's epochs) to go on from."""
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(directory)
        if latest is None:
            raise SystemExit(f"FC2_RESTORE_FROM={directory!r} holds no TensorFlow checkpoint")
        self.checkpoint.restore(latest, options=self.options).assert_existing_objects_matched()
        done = float(self.epochs_done.numpy())
        log(f"[fc2_digits] restored {latest}: {done:g} epochs done")
        return round(done * steps_per_epoch)

    def asked(self) -> bool:
        """Whether the platform asks for a checkpoint now (CHECKPOINT_NOW in the chief's checkpoint directory)."""
        return bool(self.asked_file) and os.path.exists(self.asked_file)

    def save(self, step: int, steps_per_epoch: int) -> None:
        if self.manager is None:
            return
        self.epochs_done.assign(step / steps_per_epoch)
        path = self.manager.save(checkpoint_number=step, options=self.options)
        if self.asked_file:
            with contextlib.suppress(FileNotFoundError):  # saved: the request is answered
                os.remove(self.asked_file)
            log(f"[fc2_digits] checkpoint {path} at step {step}")


# ---------------------------------------------------------------------------------------------- MultiWorkerMirrored
def run_mirrored(args, env: Fc2Env) -> int:
    import keras
    import tensorflow as tf

    data = load_data(env.data)
    if env.strategy == "mirrored":
        # Reads TF_CONFIG (cluster with `worker` tasks only; worker 0 is the chief) and blocks until all workers
        # have connected.
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        num_workers = len(env.tf_config.get("cluster", {}).get("worker", [])) or 1
    else:
        strategy = tf.distribute.get_strategy()
        num_workers = 1
    replicas = strategy.num_replicas_in_sync
    global_batch = args.batch_size * replicas
    steps_per_epoch = args.steps_per_epoch or max(1, len(data.x_train) // global_batch)
    log(
        f"[fc2_digits] strategy={env.strategy} role={env.role}:{env.task_index} chief={env.is_chief} "
        f"replicas={replicas} global_batch={global_batch} steps_per_epoch={steps_per_epoch} "
        f"input_shape={data.input_shape} classes={data.num_classes}"
    )

    # Same seed on every worker: the DATA auto-shard policy has every worker read the same shuffled stream and keep
    # its own slice of each global batch, so the order must be identical everywhere.
    dataset = (
        tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train))
        .shuffle(len(data.x_train), seed=args.seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(global_batch, drop_remainder=True)
        .prefetch(2)
    )
    options = tf.data.Options()
    # In-memory data has no files to shard by; say so instead of letting tf.data warn and fall back.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    iterator = iter(strategy.experimental_distribute_dataset(dataset.with_options(options)))

    with strategy.scope():
        model = build_model(data.input_shape, data.num_classes, args.filters, args.seed)
        # Keras 3 optimizers bind to the strategy current at construction and all-reduce gradients themselves.
        optimizer = keras.optimizers.Adam(learning_rate=args.learning_rate)
        optimizer.build(model.trainable_variables)

    train_step = make_train_step(strategy, model, optimizer, global_batch)

    @tf.function
    def wanted_by_any(wants):
        # Every worker must run the same steps (each is an all-reduce): they agree on one more epoch together.
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(wants,)), axis=None) > 0

    checkpoints = Checkpoints(env, model, optimizer)
    tracker = ProgressTracker(args.epochs, steps_per_epoch, enabled=env.is_chief)
    if env.restore_from:
        tracker.resume(checkpoints.restore(env.restore_from, steps_per_epoch))
    timing = Timing()
    while tracker.step < tracker.total:
        loss = float(train_step(iterator))
        if not timing.warm_steps:
            timing.warmed(1)
        tracker.add([loss], log_now=(tracker.step + 1) % args.log_every_steps == 0)
        wants = float(timing.elapsed() < env.train_seconds)
        if tracker.step == tracker.total and env.train_seconds and bool(wanted_by_any(tf.constant(wants))):
            tracker.add_epoch()
        # Every worker saves together (a save is a collective): at each epoch's end, and at a progress point when the
        # chief was asked to (CHECKPOINT_NOW), which the workers learn by an all-reduce.
        asked = checkpoints.manager is not None and tracker.step % args.log_every_steps == 0
        if tracker.step % steps_per_epoch == 0 or (
            asked and bool(wanted_by_any(tf.constant(float(checkpoints.asked()))))
        ):
            with timing.checkpointing():
                checkpoints.save(tracker.step, steps_per_epoch)
    timing.stop()

    failure = None
    if env.is_chief:
        try:
            finish(model, args, env, data, tracker, global_batch, timing, workers=num_workers, replicas=replicas)
        except Exception as exc:  # still reach the barrier below, or the other workers would wait there forever
            failure = exc

    if env.strategy == "mirrored":
        # Barrier: no worker leaves (and tears down its collective endpoint) before the chief has saved. Inside a
        # tf.function because eager collectives under MultiWorkerMirroredStrategy log a performance warning.
        @tf.function
        def barrier():
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)

        barrier()
    if failure is not None:
        raise failure
    log(f"[fc2_digits] worker {env.task_index} finished")
    return 0


# ------------------------------------------------------------------------------------------------- ParameterServer
def run_ps_server(env: Fc2Env) -> int:
    """`ps` and `worker` tasks: serve the cluster until the platform kills this process."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    log(f"[fc2_digits] {resolver.task_type}:{resolver.task_id} serving at {server.target}; joining")
    server.join()
    return 0


def run_ps_chief(args, env: Fc2Env) -> int:
    import keras
    import tensorflow as tf

    data = load_data(env.data)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec()
    num_workers = cluster.num_tasks("worker")
    num_ps = cluster.num_tasks("ps")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    # Asynchronous training: each scheduled step runs one batch of `batch_size` on whichever worker is free and
    # applies its gradients straight to the variables on the parameter server(s).
    global_batch = args.batch_size
    steps_per_epoch = args.steps_per_epoch or max(1, len(data.x_train) // global_batch)
    log(
        f"[fc2_digits] strategy=ps role=chief workers={num_workers} ps={num_ps} batch={global_batch} "
        f"steps_per_epoch={steps_per_epoch} input_shape={data.input_shape} classes={data.num_classes}"
    )

    with strategy.scope():
        model = build_model(data.input_shape, data.num_classes, args.filters, args.seed)
        optimizer = keras.optimizers.Adam(learning_rate=args.learning_rate)
        optimizer.build(model.trainable_variables)

    x_train, y_train = data.x_train, data.y_train

    def dataset_fn(input_context):
        # Traced on the chief, run on each worker; the arrays travel inside the dataset graph. Unseeded shuffle so
        # that workers see different orders.
        batch = input_context.get_per_replica_batch_size(global_batch)
        ds = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.shuffle(len(x_train)).repeat().batch(batch, drop_remainder=True).prefetch(2)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    worker_step = make_train_step(strategy, model, optimizer, global_batch)
    checkpoints = Checkpoints(env, model, optimizer)
    tracker = ProgressTracker(args.epochs, steps_per_epoch, enabled=True)
    if env.restore_from:
        tracker.resume(checkpoints.restore(env.restore_from, steps_per_epoch))
    timing = Timing()
    while tracker.step < tracker.total:
        # Schedule up to the next log point or epoch end (the first round: one step per worker, each compiling the
        # step), wait for those steps, then report their mean loss.
        in_epoch = tracker.step % steps_per_epoch
        to_log = args.log_every_steps - in_epoch % args.log_every_steps
        chunk = min(num_workers if not timing.warm_steps else to_log, steps_per_epoch - in_epoch)
        remote = [coordinator.schedule(worker_step, args=(per_worker_iterator,)) for _ in range(chunk)]
        coordinator.join()
        if not timing.warm_steps:
            timing.warmed(chunk)
        tracker.add([float(r.fetch()) for r in remote], log_now=chunk == to_log)
        if tracker.step == tracker.total and timing.elapsed() < env.train_seconds:
            tracker.add_epoch()
        # The steps scheduled so far are done (joined): a checkpoint at each epoch's end, and when asked to.
        if tracker.step % steps_per_epoch == 0 or checkpoints.asked():
            with timing.checkpointing():
                checkpoints.save(tracker.step, steps_per_epoch)
    timing.stop()

    finish(
        model,
        args,
        env,
        data,
        tracker,
        global_batch,
        timing,
        workers=num_workers,
        parameter_servers=num_ps,
        replicas=num_workers,
    )
    return 0


# ------------------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # hide TensorFlow's INFO chatter, keep warnings
    args, unknown = parse_args(argv)
    env = read_env()
    if unknown:
        log(f"[fc2_digits] ignoring unknown arguments: {' '.join(unknown)}")
    if env.strategy == "ps":
        if env.role in ("ps", "worker"):
            return run_ps_server(env)
        return run_ps_chief(args, env)
    return run_mirrored(args, env)


if __name__ == "__main__":
    sys.exit(main())
