"""A performance record's owner (none: the platform's, which every user's answers read; else only its owner's),
whose it was before an admin promoted it, and why no answer reads it (a figure out of its bound).

Every existing record starts as the platform's, as every record was read by everyone until now; fc2's migration
0021 then gives each record a job measured to that job's owner (the link is fc2's: nothing here names fc2), and 0006
marks the records whose figures are out of bounds."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("recommender", "0004_remove_performancerecord_job"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="performancerecord",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                help_text="Whose record: empty for the platform's, which every user's answers read; else only its owner's",
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="performance_records",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="performancerecord",
            name="promoted_from",
            field=models.ForeignKey(
                blank=True,
                help_text="Whose it was before an admin made it the platform's",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="performancerecord",
            name="unusable",
            field=models.CharField(
                blank=True,
                help_text="Why no answer reads it (a figure out of its bound); empty: usable",
                max_length=300,
            ),
        ),
    ]
