"""Which job measured a performance record is fc2's to know (fc2.JobRecord), not the recommender's: an installation
migrated before the link moved keeps every link, and deleting a job keeps the records it measured."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from fc2.models import Job, JobRecord
from recommender.models import PerformanceRecord
from tests.helpers import job_row, migrate

DROP = ("recommender", "0004_remove_performancerecord_job")  # the recommender's old column goes here


def before_the_move(executor: MigrationExecutor) -> list[tuple[str, str]]:
    """Where an installation stood before the link moved: the parents of fc2's migration that moved it (the one that
    runs before DROP)."""
    nodes = executor.loader.graph.node_map
    (moved,) = [parent.key for parent in nodes[DROP].parents if parent.key[0] == "fc2"]
    return sorted(parent.key for parent in nodes[moved].parents)


@pytest.mark.django_db(transaction=True)
def test_an_installation_migrated_before_keeps_every_link(alice):
    measured = job_row(alice)
    other = job_row(alice, measured.bundle, measured.dataset)
    executor = MigrationExecutor(connection)
    leaves, before = executor.loader.graph.leaf_nodes(), before_the_move(executor)
    try:
        old = migrate(before).loader.project_state(before).apps.get_model("recommender", "PerformanceRecord")
        run = old.objects.create(workload="w", workers=2, epoch_time_s=3.0, source="measured", job=measured.pk)
        profile = old.objects.create(workload="w", workers=1, bandwidth_mbps=80.0, source="profiled", job=measured.pk)
        elsewhere = old.objects.create(workload="w", workers=4, epoch_time_s=2.0, source="measured", job=other.pk)
        imported = old.objects.create(workload="w", workers=8, epoch_time_s=1.0)
    finally:
        migrate(leaves)

    links = set(JobRecord.objects.values_list("record_id", "job_id"))
    assert links == {(run.pk, measured.pk), (profile.pk, measured.pk), (elsewhere.pk, other.pk)}
    assert PerformanceRecord.objects.count() == 4 and not JobRecord.objects.filter(record_id=imported.pk).exists()
    with connection.cursor() as cursor:
        columns = connection.introspection.get_table_description(cursor, PerformanceRecord._meta.db_table)
    assert "job_id" not in {column.name for column in columns}


def test_deleting_a_job_keeps_the_records_it_measured(alice):
    job = job_row(alice)
    record = PerformanceRecord.objects.create(workload="w", workers=2, epoch_time_s=3.0, source="measured")
    JobRecord.objects.create(job=job, record=record)

    Job.objects.filter(pk=job.pk).delete()

    assert PerformanceRecord.objects.filter(pk=record.pk).exists() and not JobRecord.objects.exists()
