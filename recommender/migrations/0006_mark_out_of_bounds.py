"""Marks every existing record whose figures are out of their bounds (recommender/bounds.py) as unusable, saying
which: an epoch time of 1e308 s or 1e-300 s, a NaN (PostgreSQL keeps one; SQLite stored it as NULL), a negative
bandwidth. Marked, not fixed nor deleted: no figure can be guessed back, and the admin shows the row and its reason
to an operator who may correct it (saving it there clears the mark) or delete it. No answer reads a marked row
(`PerformanceRecord.objects.readable_by`). Undone by clearing the marks."""

from django.db import migrations

from recommender.bounds import BOUNDS, out_of_bounds


def mark(apps, schema_editor):
    PerformanceRecord = apps.get_model("recommender", "PerformanceRecord")
    rows = PerformanceRecord.objects.filter(unusable="").order_by("pk").values("pk", *BOUNDS)
    for row in rows.iterator():
        if problems := out_of_bounds(row):
            reason = "; ".join(problems)[:300]
            PerformanceRecord.objects.filter(pk=row["pk"]).update(unusable=reason)


def unmark(apps, schema_editor):
    PerformanceRecord = apps.get_model("recommender", "PerformanceRecord")
    PerformanceRecord.objects.exclude(unusable="").update(unusable="")


class Migration(migrations.Migration):

    dependencies = [
        ("recommender", "0005_owner_trust_unusable"),
    ]

    operations = [
        migrations.RunPython(mark, unmark),
    ]
