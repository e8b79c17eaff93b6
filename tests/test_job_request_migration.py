"""A job's request kept apart from its plan (migration fc2 0018): rows from before it keep what they asked, as well as
their columns tell it; a job not yet planned has its plan emptied; state `profiling` becomes `recommending` and step
`finish` `collect`."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from fc2.models import Job, JobEvent
from tests.helpers import make_bundle, make_dataset, migrate

BEFORE = [("fc2", "0017_job_resends")]


@pytest.mark.django_db(transaction=True)
def test_rows_from_before_keep_what_they_asked(alice):
    bundle, dataset = make_bundle(alice, "code"), make_dataset(alice, "data")
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        apps = migrate(BEFORE).loader.project_state(BEFORE).apps
        old, old_event = apps.get_model("fc2", "Job"), apps.get_model("fc2", "JobEvent")
        rows = {"owner_id": alice.pk, "bundle_id": bundle.pk, "dataset_id": dataset.pk}
        queued = old.objects.create(
            **rows, state="queued", algorithm="model", strategy="auto", workers=4, hourly_budget="1.5", budget="9"
        )
        chosen = old.objects.create(
            **rows, state="profiling", algorithm="model", strategy="mirrored", workers=3, worker_type="c4.xlarge",
            recommendation={"extra": {"strategy": "mirrored"}}, resends={"finish": 1, "provision": 2},
        )  # fmt: skip
        manual = old.objects.create(**rows, state="succeeded", strategy="ps", workers=2, worker_type="m4.xlarge")
        old_event.objects.create(job_id=chosen.pk, state="profiling", message="choosing the cluster")
    finally:
        migrate(leaves)

    queued, chosen, manual = (Job.objects.get(pk=row.pk) for row in (queued, chosen, manual))
    assert (queued.request["strategy"], queued.request["workers"], queued.request["budget"]) == ("auto", 4, "1.5000")
    assert (queued.budget, queued.total_budget, queued.request["total_budget"]) == (1.5, 9, "9.0000")
    assert (queued.strategy, queued.workers, queued.planned) == ("", None, False)  # its recommend step plans it
    assert (chosen.state, chosen.request["strategy"], chosen.strategy, chosen.workers) == (
        "recommending", "auto", "mirrored", 3
    )  # fmt: skip
    assert chosen.request["worker_type"] == "" and chosen.resends == {"collect": 1, "provision": 2}
    assert JobEvent.objects.get(job=chosen).state == "recommending"
    assert (manual.request["strategy"], manual.request["worker_type"], manual.workers) == ("ps", "m4.xlarge", 2)
