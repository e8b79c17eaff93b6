"""How a job's outcome reads: headline metric, rounded metrics, failure summaries (fc2.results, pure functions)."""

from __future__ import annotations

import pytest

from fc2.results import Headline, failure_summary, headline, last_meaningful_line, rounded, significant

TF_START_UP = """\
2026-11-23 12:00:01.123456: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on.
2026-11-23 12:00:01.234567: I tensorflow/core/platform/cpu_feature_guard.cc:210] This TensorFlow binary is optimized
To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with …
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1763899201.345678   12345 grpc_server_lib.cc:467] Started server with target: grpc://localhost:2222
W0000 00:00:1763899201.456789   12345 gpu_device.cc:2342] Cannot dlopen some GPU libraries.
E0000 00:00:1763899201.567890   12345 cuda_executor.cc:1228] failed call to cuInit: UNKNOWN ERROR (303)
"""
TRACEBACK = """\
Traceback (most recent call last):
  File "/work/fc2_digits/main.py", line 12, in <module>
    main()
ValueError: Input 0 of layer "dense" is incompatible with the layer: expected axis -1 to have value 64
"""


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        pytest.param(TF_START_UP + TRACEBACK, TRACEBACK.splitlines()[-1], id="traceback-after-start-up"),
        pytest.param(TRACEBACK + TF_START_UP, TRACEBACK.splitlines()[-1], id="noise-after-the-traceback"),
        pytest.param("epoch 1\nKilled\n\n", "Killed", id="blank-lines-at-the-end"),
        pytest.param(TF_START_UP, TF_START_UP.splitlines()[-1], id="only-noise-keeps-the-last-line"),
        pytest.param("", "", id="empty"),
    ],
)
def test_last_meaningful_line(log, expected):
    assert last_meaningful_line(log) == expected


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        pytest.param(
            f"chief-0 failed with exit code 1; its log ends:\n{TF_START_UP}{TRACEBACK}{TF_START_UP}",
            f"chief-0 failed with exit code 1: {TRACEBACK.splitlines()[-1]}",
            id="node-failure",
        ),
        pytest.param("worker-0 failed with exit code 3", "worker-0 failed with exit code 3", id="no-log"),
        pytest.param("cancelled by alice", "cancelled by alice", id="not-a-node"),
        pytest.param("", "", id="no-reason"),
    ],
)
def test_failure_summary(reason, expected):
    assert failure_summary(reason) == expected


@pytest.mark.parametrize(
    ("metrics", "loss", "expected"),
    [
        (
            {"test_accuracy": 0.97345, "test_loss": 0.1, "final_train_loss": 0.2},
            0.3,
            Headline("test accuracy", "97.3 %"),
        ),
        ({"test_accuracy": 1}, None, Headline("test accuracy", "100 %")),
        ({"test_loss": 0.0834567, "final_train_loss": 0.2}, 0.3, Headline("test loss", "0.0835")),
        ({"final_train_loss": 0.123456}, 0.3, Headline("train loss", "0.123")),
        ({"accuracy": 0.9}, 1.23456, Headline("loss", "1.23")),
        ({"test_accuracy": float("nan"), "test_loss": None}, 2.0, Headline("loss", "2")),
        ({"test_accuracy": True}, None, None),
        ({}, None, None),
    ],
)
def test_headline(metrics, loss, expected):
    assert headline(metrics, loss) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.934567, "0.935"), (12345.6, "12300"), (3, "3"), (0.00012345, "0.000123"), (1e-9, "1e-09"), (-2.5, "-2.5")],
)
def test_significant(value, expected):
    assert significant(value) == expected


def test_rounded_leaves_what_is_not_a_number():
    assert [rounded(v) for v in (0.97345, "adam", None, False)] == ["0.973", "adam", None, False]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (1437, "1437"),  # a count exactly (train_examples), never 1440
        (10**9 + 7, "1000000007"),
        (float("nan"), "nan"),
        ([0.9, 0.5, 0.25], "[0.9, 0.5, 0.25]"),  # a short list as the list
        ([8, 8, 1], "[8, 8, 1]"),  # an input shape
        ([0.9, 0.5, 0.25, 0.2, 0.1], "5 values, last 0.1 (0.1–0.9)"),
        (1143.6, "1144"),  # as the throughput beside it reads, never 1140
        ([round(1 / (i + 1), 4) for i in range(40)], "40 values, last 0.025 (0.025–1)"),  # a loss list: one short pill
        ([7], "7"),
        ([], "none"),
        (["a", 1], "2 values"),
        ({"precision": 0.9, "recall": 0.8}, "2 entries"),
    ],
)
def test_rounded_shows_counts_exactly_and_sums_up_lists(value, shown):
    assert rounded(value) == shown
